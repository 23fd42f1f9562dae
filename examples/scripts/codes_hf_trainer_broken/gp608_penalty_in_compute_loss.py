"""The Hugging Face Trainer with a compute_loss override that adds an input-gradient penalty taken without
create_graph=True: the penalty is a constant to the optimizer, so it trains nothing.

Public report: https://github.com/igul222/improved_wgan_training/issues/18 ("the graph of the gradients respect to
interpolates data don't connect to the graph of the net ... if I plus gradient penalty to loss, it won't work").

    python gp608_penalty_in_compute_loss.py --max_steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": ["GP608"], "culprits": [], "line": 51, "args": ["--max_steps=8"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class Points(Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))

    def forward(self, x, labels=None):
        return {"logits": self.net(x)}


class PenaltyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(x=inputs["x"])["logits"]
        x = inputs["x"].clone().requires_grad_(True)
        grad = torch.autograd.grad(model(x=x)["logits"].logsumexp(-1).sum(), x)[0]
        loss = F.cross_entropy(logits, inputs["labels"]) + 0.1 * grad.pow(2).sum(1).mean()
        return (loss, {"logits": logits}) if return_outputs else loss


model = Classifier()
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
trainer = PenaltyTrainer(model=model, args=training_args, train_dataset=Points())
trainer.train()
