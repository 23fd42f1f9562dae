"""The healthy twin of steps_accelerate_broken: zero_grad() after step(), so each step gets its batch's gradient.

Written from public threads asking where zero_grad() goes (https://github.com/rll/deepul/issues/12: moving it
"breaks the model and the model fails to learn anything"; https://github.com/patrickloeber/pytorchTutorial/issues/19).

    accelerate launch train.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for epoch in range(args.epochs):
    model.train()
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
