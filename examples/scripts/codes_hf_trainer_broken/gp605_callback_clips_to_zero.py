"""The Hugging Face Trainer with a callback that clips the head's gradient in on_pre_optimizer_step with max_norm=0:
clip_grad_norm_(..., max_norm=0) scales every gradient by 0, so the head trains nothing while the loss goes down.

Public report: https://github.com/OpenNMT/OpenNMT-py/issues/1140 ("the grads of parameters will be zero when set the
-max_grad_norm 0"). The Trainer's own max_grad_norm=0 means "no clipping"; a callback's clip_grad_norm_ does not.

    python gp605_callback_clips_to_zero.py --max_steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": ["GP605"], "culprits": ["head.weight", "head.bias"], "line": 56,
          "args": ["--max_steps=8"], "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--head_max_norm", type=float, default=0.0)  # meant: 0 = no clipping
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
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  learning_rate=1e-3, warmup_steps=0, report_to=[], save_strategy="no",
                                  logging_steps=10, use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Points(),
                  callbacks=[ClipHead(model.head, args.head_max_norm)])
trainer.train()
