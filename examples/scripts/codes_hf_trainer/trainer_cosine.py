"""The healthy twin of codes_hf_trainer_broken/gp612_epoch_cosine_stepped_per_step: the Trainer builds its own cosine
schedule (lr_scheduler_type="cosine"), counted in optimizer steps over the whole run.

Written from https://github.com/ivadomed/ivadomed/issues/57 and https://github.com/huggingface/diffusers/issues/1650.

    python trainer_cosine.py --epochs 10
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "absent": ["GP612", "GP603", "GP604"],
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
training_args = TrainingArguments(output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=16,
                                  lr_scheduler_type="cosine",
                                  report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Points(), optimizers=(optimizer, None))
trainer.train()
