"""A plain loop accumulating 4 micro-batches whose losses are summed, not averaged: each step is 4x the intended one.

Public report: https://github.com/karpathy/nanoGPT/issues/206 ("performs loss.backward() without first normalizing
the loss value to account for number of gradient accumulation steps").

    python gp601_accumulation_not_divided.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP601"], "culprits": [], "line": 30, "args": ["--steps=8"],
          "options": {"steps": 2}}
ACCUM = 4
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(args.steps):
    optimizer.zero_grad()
    for _micro in range(ACCUM):
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    optimizer.step()
