"""An accelerate loop that steps its prepared scheduler before the optimizer: the schedule's first value is skipped.

Public reports: https://github.com/zju3dv/NeuralRecon/issues/51 (PyTorch's "Detected call of `lr_scheduler.step()`
before `optimizer.step()`" warning, and whether it matters) and https://github.com/idiap/coqui-ai-Trainer/pull/20 (a
trainer that stepped a scheduler whose optimizer had not stepped).

    accelerate launch gp604_scheduler_before_optimizer.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP604"], "culprits": [], "line": 36, "severity": "warning",
          "args": ["--epochs=1"], "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.5)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        scheduler.step()
        optimizer.step()
