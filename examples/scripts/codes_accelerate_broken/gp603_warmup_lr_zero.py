"""An accelerate loop whose prepared warm-up scheduler uses integer division: the learning rate is 0 for the first
100 steps.

Public reports: https://github.com/EleutherAI/gpt-neox/issues/1373 (warm-up leaves lr at 0 for the first step, so
step 1 equals step 0) and https://github.com/karpathy/nanoGPT/pull/578 (non-zero lr at iteration 0).

    accelerate launch gp603_warmup_lr_zero.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP603"], "culprits": ["0.weight"], "line": 31, "args": ["--epochs=1"],
          "options": {"steps": 3}}
WARMUP = 100
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step // WARMUP))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        scheduler.step()
