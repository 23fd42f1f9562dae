"""Gradient accumulation over 4 micro-batches whose loss is divided by 4 twice: compute_loss() already returns
`loss / ACCUM` and the loop divides again before backward(), so each step gets 1/4 of the batch's mean gradient.

Written from the public report https://github.com/llm-random/llm-random/pull/529 ("losses are already divided by grad
accumulation steps", the second division removed). Nothing raises: training is only 4x slower than configured.
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
torch.manual_seed(0)
ACCUM = 4

data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
loader = DataLoader(data, batch_size=4, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def compute_loss(x, y):
    return F.cross_entropy(model(x), y) / ACCUM  # scaled for accumulation here ...


for i, (x, y) in enumerate(loader):
    loss = compute_loss(x, y)
    (loss / ACCUM).backward()  # ... and again here
    if (i + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
    if i + 1 >= args.steps * ACCUM:
        break
