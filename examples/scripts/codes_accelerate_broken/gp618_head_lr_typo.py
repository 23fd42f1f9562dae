"""An accelerate loop whose head group's learning rate is written in the wrong unit (1e1 where 1e-1 was meant):
every step changes the head by more than its own weights, while the body trains normally.

Public reports: https://github.com/rasbt/LLMs-from-scratch/issues/692 (a per-group learning rate set wrongly) and
https://github.com/MITDeepLearning/introtodeeplearning/pull/108 (a learning rate written as 1e-1 where 0.01 was meant).

    accelerate launch gp618_head_lr_typo.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP618"], "culprits": ["head.weight"], "line": 41, "severity": "warning",
          "args": ["--epochs=1"], "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(12, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


model = Net()
optimizer = torch.optim.SGD([{"params": model.body.parameters()},
                             {"params": model.head.parameters(), "lr": 1e1}], lr=1e-2)  # meant: 1e-1
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
