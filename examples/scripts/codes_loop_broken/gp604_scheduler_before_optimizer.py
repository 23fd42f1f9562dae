"""A plain loop that calls scheduler.step() before optimizer.step(): the schedule's first value is skipped.

Public report: https://github.com/zju3dv/NeuralRecon/issues/51 (PyTorch's "Detected call of `lr_scheduler.step()`
before `optimizer.step()`" warning, and whether it matters).

    python gp604_scheduler_before_optimizer.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP604"], "culprits": [], "line": 29, "severity": "warning",
          "args": ["--steps=8"], "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
for _step in range(args.steps):
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    scheduler.step()
    optimizer.step()
