"""The Hugging Face Trainer with gradient_accumulation_steps=4 and a compute_loss override that divides the loss by
the accumulation steps, which the Trainer does already: each optimizer step gets 1/4 of the batch's mean gradient.

Written from the public threads https://github.com/huggingface/transformers/issues/26312 (whether to divide by
gradient_accumulation_steps before backward) and https://github.com/huggingface/transformers/issues/40709 (the loss
divided by gradient_accumulation_steps twice on its way to backward). Nothing raises.

    python train.py --max_steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

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

    def forward(self, x, labels=None):
        return self.head(self.body(x))


class AccumTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(x=inputs["x"])
        loss = F.cross_entropy(logits, inputs["labels"])
        return loss / self.args.gradient_accumulation_steps  # the Trainer divides by it too


training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
                                  gradient_accumulation_steps=4, learning_rate=1e-3, report_to=[], save_strategy="no",
                                  logging_steps=10, use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False)
trainer = AccumTrainer(model=Classifier(), args=training_args, train_dataset=Points())
trainer.train()
