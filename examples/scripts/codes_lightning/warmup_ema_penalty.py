"""The healthy twin of codes_lightning_broken/gp603, gp608 and gp609, in one Lightning module: a warm-up that starts
above 0 (float division), a gradient penalty taken with create_graph=True, and a mean teacher moved in place by its
EMA in on_train_batch_end.

Written from https://github.com/EleutherAI/gpt-neox/issues/1373 (warm-up must not leave lr at 0),
https://github.com/igul222/improved_wgan_training/issues/18 (create_graph=True for a gradient penalty) and
https://github.com/huggingface/diffusers/issues/1895 (an EMA that must move).

    python warmup_ema_penalty.py --max_steps 100
"""

import argparse
import copy

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--max_steps=8"], "options": {"steps": 3},
          "absent": ["GP603", "GP608", "GP609", "GP606"]}
DECAY, WARMUP = 0.9, 100
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
args = parser.parse_args()


class LitMeanTeacher(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.ema_teacher = copy.deepcopy(self.student).requires_grad_(False)

    def input_penalty(self, x):
        x = x.clone().requires_grad_(True)
        grad = torch.autograd.grad(self.student(x).logsumexp(-1).sum(), x, create_graph=True)[0]
        return grad.pow(2).sum(1).mean()

    def training_step(self, batch, batch_idx):
        x, y = batch
        student = self.student(x)
        teacher = self.ema_teacher(x)
        consistency = F.mse_loss(student.softmax(-1), teacher.softmax(-1))
        return F.cross_entropy(student, y) + consistency + 0.1 * self.input_penalty(x)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            for e, p in zip(self.ema_teacher.parameters(), self.student.parameters(), strict=True):
                e.lerp_(p, 1 - DECAY)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.student.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
        return DataLoader(ds, batch_size=8)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitMeanTeacher())
