"""Exits before training when its required argument is missing."""

import sys

import torch
import torch.nn as nn

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if len(sys.argv) < 2:
    sys.exit("usage: exits_early.py DATA_DIR")
loss = model(torch.randn(8, 4)).pow(2).mean()
loss.backward()
opt.step()
