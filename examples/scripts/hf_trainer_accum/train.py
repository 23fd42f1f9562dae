"""The Hugging Face Trainer with gradient_accumulation_steps=4 and its own loss scaling (the healthy twin of
hf_trainer_accum_broken): the Trainer divides each micro-batch loss by the accumulation steps itself.

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
        logits = self.head(self.body(x))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
                                  gradient_accumulation_steps=4, learning_rate=1e-3, report_to=[], save_strategy="no",
                                  logging_steps=10, use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=Classifier(), args=training_args, train_dataset=Points())
trainer.train()
