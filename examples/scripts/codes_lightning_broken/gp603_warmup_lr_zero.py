"""A Lightning module whose warm-up lambda uses integer division: the learning rate is 0 for the first 100 steps.

Public reports: https://github.com/EleutherAI/gpt-neox/issues/1373 (warm-up leaves lr at 0 for the first step, so
step 1 equals step 0) and https://github.com/karpathy/nanoGPT/pull/578 (non-zero lr at iteration 0).

    python gp603_warmup_lr_zero.py --max_steps 1000
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP603"], "culprits": ["body.0.weight"], "line": 37,
          "args": ["--max_steps=8"], "options": {"steps": 3}}
WARMUP = 100
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=1000)
args = parser.parse_args()


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(self.body(x)), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-4)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step // WARMUP))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
        return DataLoader(ds, batch_size=8)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitClassifier())
