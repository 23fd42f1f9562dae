"""The healthy twin of steps_accum_twice_broken: each of the 4 micro-batch losses is divided by 4 once, so the
accumulated gradient is the batch's mean gradient (the fix of https://github.com/karpathy/nanoGPT/issues/168)."""

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

for i, (x, y) in enumerate(loader):
    loss = F.cross_entropy(model(x), y)
    (loss / ACCUM).backward()
    if (i + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
    if i + 1 >= args.steps * ACCUM:
        break
