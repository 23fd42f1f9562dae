"""A plain loop whose head group's learning rate is written in the wrong unit (1e1 where 1e-1 was meant): every step
changes the head by more than its own weights, while the body trains normally.

Public reports: https://github.com/rasbt/LLMs-from-scratch/issues/692 (a per-group learning rate set wrongly) and
https://github.com/MITDeepLearning/introtodeeplearning/pull/108 (a learning rate written as 1e-1 where 0.01 was meant).

    python gp618_head_lr_typo.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP618"], "culprits": ["head.weight"], "line": 35, "severity": "warning",
          "args": ["--steps=8"], "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


model = Net()
optimizer = torch.optim.SGD([{"params": model.body.parameters()},
                             {"params": model.head.parameters(), "lr": 1e1}], lr=1e-2)  # meant: 1e-1
for _step in range(args.steps):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
