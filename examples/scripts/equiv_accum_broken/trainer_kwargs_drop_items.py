"""The Hugging Face Trainer with gradient_accumulation_steps=4 and a model whose forward declares **kwargs but drops
num_items_in_batch: the Trainer sees **kwargs, takes the model to normalise its loss by the token count of the whole
accumulated batch, and stops dividing by the accumulation steps; the model returns each micro-batch's mean, so every
optimizer step gets 4 times the gradient of the same examples as one batch (with SGD, 4 times the learning rate).
Nothing raises. Written from https://github.com/huggingface/transformers/issues/47688 ("Heads that declare **kwargs but
drop num_items_in_batch train with an inflated loss under gradient accumulation") and
https://github.com/huggingface/transformers/issues/37766.

    python trainer_kwargs_drop_items.py --max_steps 100
    gradprobe check_equivalence --script trainer_kwargs_drop_items.py -- --max_steps 8
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "check_equivalence", "codes": ["GP802"], "culprits": ["body.0.weight", "head.bias"], "line": 50,
          "args": ["--max_steps=8"], "ratio_is": "k"}

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

    def forward(self, x, labels=None, **kwargs):  # num_items_in_batch arrives in kwargs and is dropped
        logits = self.head(self.body(x))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
                                  gradient_accumulation_steps=4, optim="sgd", learning_rate=0.05, report_to=[],
                                  save_strategy="no", logging_steps=10, use_cpu=True, dataloader_num_workers=0,
                                  remove_unused_columns=False)
Trainer(model=Classifier(), args=training_args, train_dataset=Points()).train()
