"""The healthy twin of codes_loop_broken/gp602, gp603, gp604, gp607 and gp618: the optimizer is built once before the
epoch loop, with a head group at 10x the body's learning rate; the warm-up starts above 0 (float division); each step
clears the gradients, steps the optimizer, then the scheduler.

Written from https://github.com/EleutherAI/gpt-neox/issues/1373 (a warm-up must not leave lr at 0),
https://github.com/zju3dv/NeuralRecon/issues/51 (scheduler.step() after optimizer.step()) and
https://github.com/rasbt/LLMs-from-scratch/issues/692 (per-group learning rates).

    python warmup_groups_built_once.py --epochs 10
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--epochs=4"], "options": {"steps": 4},
          "absent": ["GP602", "GP603", "GP604", "GP607", "GP618"]}
WARMUP = 100
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


data = TensorDataset(torch.randn(16, 6), torch.randint(0, 3, (16,)))
loader = DataLoader(data, batch_size=8)
model = Net()
optimizer = torch.optim.Adam([{"params": model.body.parameters()},
                              {"params": model.head.parameters(), "lr": 1e-2}], lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
