"""A cosine schedule written in epochs (T_max = the number of epochs) but stepped after every batch: the learning rate
falls to its minimum after 10 batches and climbs back, again and again, inside the first epoch.

Written from https://github.com/kohya-ss/sd-scripts/issues/601 (T_max counts scheduler.step() calls, "NOT the number of
epochs") and https://github.com/konstmish/prodigy/issues/10 (T_max: the total steps or the epochs?).

    python train.py --epochs 10
"""

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
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
