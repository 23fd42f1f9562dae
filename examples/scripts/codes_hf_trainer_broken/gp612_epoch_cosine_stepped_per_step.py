"""The Hugging Face Trainer given a cosine schedule written in epochs (T_max = num_train_epochs) through
optimizers=(optimizer, scheduler): the Trainer steps the scheduler after every optimizer step, so the learning rate
falls to its minimum after 10 steps and climbs back, again and again, inside the first epoch.

Public reports: https://github.com/ivadomed/ivadomed/issues/57 (a CosineAnnealingLR(optimizer, num_epochs) "updated
the LR at each batch instead of each epoch, thereby unintentionally doing multiple cycles") and
https://github.com/huggingface/diffusers/issues/1650 (what T_max counts).

    python gp612_epoch_cosine_stepped_per_step.py --epochs 10
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": ["GP612"], "culprits": [], "line": 52, "severity": "warning",
          "args": ["--epochs=10"], "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class Points(Dataset):
    def __init__(self, n=400):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


model = Classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
training_args = TrainingArguments(output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=16,
                                  report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Points(), optimizers=(optimizer, scheduler))
trainer.train()
