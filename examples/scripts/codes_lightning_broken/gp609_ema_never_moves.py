"""A Lightning mean teacher whose EMA update in on_train_batch_end rebinds the loop variable instead of writing into
the teacher's tensors: the teacher stays at its initial weights while the student trains.

Public report: https://github.com/huggingface/diffusers/issues/1895 ("EMA model is not updated properly": "the
EMAModel is not updated" under one training setup while it works under another).

    python gp609_ema_never_moves.py --max_steps 100
"""

import argparse
import copy

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP609"], "culprits": ["ema_teacher.0.weight"], "line": 31,
          "severity": "error", "args": ["--max_steps=8"], "options": {"steps": 3}}
DECAY = 0.9
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
args = parser.parse_args()


class LitMeanTeacher(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.ema_teacher = copy.deepcopy(self.student).requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        student = self.student(x)
        teacher = self.ema_teacher(x)
        return F.cross_entropy(student, y) + F.mse_loss(student.softmax(-1), teacher.softmax(-1))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            for e, p in zip(self.ema_teacher.parameters(), self.student.parameters(), strict=True):
                e = DECAY * e + (1 - DECAY) * p  # the bug: rebinds e, the teacher never changes

    def configure_optimizers(self):
        return torch.optim.AdamW(self.student.parameters(), lr=1e-3)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
        return DataLoader(ds, batch_size=8)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitMeanTeacher())
