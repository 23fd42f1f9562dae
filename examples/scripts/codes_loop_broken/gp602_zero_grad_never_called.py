"""A plain loop that never clears gradients: every step adds all earlier steps' gradients to its own.

Public report: https://github.com/IDEA-Research/DN-DETR/issues/19 ("It looks like you forgot optimizer.zero_grad()").

    python gp602_zero_grad_never_called.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP602"], "culprits": [], "line": 26, "args": ["--steps=8"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for _step in range(args.steps):
    x, y = torch.randn(10, 5), torch.randn(10, 1)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
