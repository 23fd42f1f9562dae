"""The healthy twin of codes_hf_trainer_broken/gp618 and gp605: a custom optimizer whose head group has 10x the
backbone's learning rate (AdamW, 1e-2 against 1e-3), and a callback that clips the head's gradient to a positive max_norm.

Written from https://github.com/rasbt/LLMs-from-scratch/issues/692 (per-group learning rates) and
https://github.com/OpenNMT/OpenNMT-py/issues/1140 (clipping that must not zero the gradient).

    python head_lr_clip_positive.py --max_steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--max_steps=8"], "options": {"steps": 4},
          "absent": ["GP603", "GP605", "GP606", "GP618"]}
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
        self.backbone = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x, labels=None):
        logits = self.head(self.backbone(x))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}



class ClipHead(TrainerCallback):
    def __init__(self, head, max_norm):
        self.head, self.max_norm = head, max_norm

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), max_norm=self.max_norm)


model = Classifier()
optimizer = torch.optim.AdamW([{"params": model.backbone.parameters()},
                               {"params": model.head.parameters(), "lr": 1e-2}], lr=1e-3)
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Points(), optimizers=(optimizer, None),
                  callbacks=[ClipHead(model.head, 1.0)])
trainer.train()
