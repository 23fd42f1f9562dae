"""A plain loop that builds its Adam optimizer at the top of every epoch: the moments and step count restart each time.

Public write-up: https://www.codegenes.net/blog/pytorch-reset-optimizer (re-initialising the optimizer is how Adam's
state is reset: done in the loop, every epoch starts from empty state).

    python gp607_optimizer_rebuilt_each_epoch.py --epochs 10
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP607"], "culprits": [], "line": 27, "args": ["--epochs=4"],
          "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()
torch.manual_seed(0)

data = TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))
loader = DataLoader(data, batch_size=6)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
for _epoch in range(args.epochs):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
