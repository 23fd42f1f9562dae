"""The healthy twin of steps_onecycle_broken: the one-cycle schedule sized in batches is stepped after every batch."""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()
torch.manual_seed(0)

data = TensorDataset(torch.randn(400, 8), torch.randint(0, 3, (400,)))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, epochs=args.epochs,
                                                steps_per_epoch=len(loader))

for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
