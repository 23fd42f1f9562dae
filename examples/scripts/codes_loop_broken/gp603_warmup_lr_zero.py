"""A plain loop whose warm-up lambda uses integer division: the learning rate is 0 for the first 100 steps.

Public reports: https://github.com/EleutherAI/gpt-neox/issues/1373 (warm-up leaves lr at 0 for the first step, so
step 1 equals step 0) and https://github.com/karpathy/nanoGPT/pull/578 (non-zero lr at iteration 0).

    python gp603_warmup_lr_zero.py --steps 1000
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP603"], "culprits": ["0.weight"], "line": 25, "args": ["--steps=8"],
          "options": {"steps": 3}}
WARMUP = 100
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step // WARMUP))
for _step in range(args.steps):
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    scheduler.step()
