"""A tiny language model trained by the Hugging Face Trainer whose output head is "tied" to the embedding with
`.data`: `nn.Parameter(self.embed.weight.data)` is a second Parameter over the embedding's storage. The Trainer's AdamW
holds both, so each step applies two updates (two moment states) to one matrix, each from part of its gradient;
nothing raises. check_equivalence's storage comparison runs on the script's first step under the Trainer and finds it
at the tie's line (GP805); the model's custom RMSNorm Function is checked there too (correct: said as verified). After
https://github.com/pytorch/xla/issues/2719 ("If you set the `.weight` instead of `.weight.data`, the behavior is
consistent with the docs"); the healthy twin is equiv_ops/trainer_tied.py.

    python trainer_data_tie.py --max_steps 100
    gradprobe check_equivalence --script trainer_data_tie.py -- --max_steps=2
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "check_equivalence", "world_size": 1, "codes": ["GP805"], "culprits": ["head.weight"], "line": 64,
          "args": ["--max_steps=2"], "verified": ["perturbed"],
          "options": {"compare": ["custom_ops", "storage", "packing"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x * rstd
        g = grad_out * weight
        grad_x = rstd * (g - x_hat * (g * x_hat).mean(dim=-1, keepdim=True))
        grad_weight = (grad_out * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight, self.eps)


class TinyLM(nn.Module):
    def __init__(self, vocab=40, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = nn.Parameter(self.embed.weight.data)

    def forward(self, input_ids, labels=None, **kwargs):
        logits = self.head(self.norm(torch.tanh(self.mix(self.embed(input_ids)))))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return {"loss": loss, "logits": logits}


class Tokens(Dataset):
    def __init__(self, n=128):
        self.ids = torch.randint(0, 40, (n, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
Trainer(model=TinyLM(), args=training_args, train_dataset=Tokens()).train()
