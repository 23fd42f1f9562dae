"""A plain loop with zero_grad() inside the micro-batch loop: only the last of 4 micro-batches reaches each step.

Public report: https://github.com/karpathy/nanoGPT/issues/206 (how accumulation must be written: one zero_grad() per
optimizer step, each micro-batch's loss scaled).

    python gp601_zero_grad_inside_accumulation.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP601"], "culprits": [], "line": 28, "args": ["--steps=8"],
          "options": {"steps": 2}}
ACCUM = 4
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _step in range(args.steps):
    for _micro in range(ACCUM):
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y) / ACCUM
        loss.backward()
    optimizer.step()
