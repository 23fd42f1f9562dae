"""An accelerate loop that builds and prepares its Adam optimizer again at the top of every epoch: the moments and
step count restart each time.

Public write-up: https://www.codegenes.net/blog/pytorch-reset-optimizer (re-initialising the optimizer is how Adam's
state is reset: done in the loop, every epoch starts from empty state); asked about accelerate in
https://github.com/huggingface/accelerate/issues/948 (preparing again inside the training loop).

    accelerate launch gp607_optimizer_rebuilt_each_epoch.py --epochs 4
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP607"], "culprits": [], "line": 33, "args": ["--epochs=4"],
          "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
loader = DataLoader(TensorDataset(*data[:16]), batch_size=8)
model = accelerator.prepare(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
loader = accelerator.prepare(loader)
for _epoch in range(args.epochs):
    optimizer = accelerator.prepare(torch.optim.Adam(model.parameters(), lr=1e-3))
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
