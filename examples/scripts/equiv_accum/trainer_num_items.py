"""Healthy twin of equiv_accum_broken/trainer_kwargs_drop_items.py: the model's forward takes num_items_in_batch, the
number of labelled examples of the whole accumulated batch the Trainer counts, and divides its summed loss by it, so
the 4 micro-batches' losses add up to the mean over the whole batch (the fix of
https://github.com/huggingface/transformers/pull/34191 and https://github.com/huggingface/transformers/pull/34283).

    python trainer_num_items.py --max_steps 100
    gradprobe check_equivalence --script trainer_num_items.py -- --max_steps 8
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "check_equivalence", "codes": [], "healthy": True, "absent": ["GP802", "GP806"],
          "args": ["--max_steps=8"]}

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class Points(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

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
        if num_items_in_batch is None:
            return {"loss": F.cross_entropy(logits, labels), "logits": logits}
        return {"loss": F.cross_entropy(logits, labels, reduction="sum") / num_items_in_batch, "logits": logits}


training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
                                  gradient_accumulation_steps=4, optim="sgd", learning_rate=0.05, report_to=[],
                                  save_strategy="no", logging_steps=10, use_cpu=True, dataloader_num_workers=0,
                                  remove_unused_columns=False)
Trainer(model=Classifier(), args=training_args, train_dataset=Points()).train()
