"""The Hugging Face Trainer at 2 processes with `average_tokens_across_devices=False` and a model that normalises its
summed loss by num_items_in_batch: each process then counts only its own labelled examples (some are unlabelled,
-100), so each process's loss is a mean over its own items and DDP's average of the processes' gradients weighs an
item of a process holding few more than one of a process holding many: not the gradient one process computes on the
global batch. Written from https://github.com/huggingface/transformers/issues/34242 ("token averaging in DDP seems to
have the same issue") and its fix, https://github.com/huggingface/transformers/pull/34373
(average_tokens_across_devices, the default since).

    torchrun --nproc_per_node=2 trainer_tokens_per_device.py --max_steps 100
    gradprobe check_equivalence --script trainer_tokens_per_device.py --world-size 2 -- --max_steps 8
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["body.0.weight", "head.bias"],
          "line": 51, "args": ["--max_steps=8"], "options": {"compare": ["ranks"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class Points(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.y[torch.rand(n, generator=g) < 0.4] = -100  # unlabelled examples: each process holds a different number

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x, labels=None, num_items_in_batch=None, **kwargs):
        logits = self.head(self.body(x))
        return {"loss": F.cross_entropy(logits, labels, reduction="sum") / num_items_in_batch, "logits": logits}


training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  optim="sgd", learning_rate=0.05, report_to=[], save_strategy="no", logging_steps=10,
                                  use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False,
                                  average_tokens_across_devices=False)
Trainer(model=Classifier(), args=training_args, train_dataset=Points()).train()
