"""The healthy twin of codes_accelerate_broken/gp603, gp607, gp608 and gp618, in one accelerate loop: the optimizer
is built and prepared once, its head group at 10x the body's learning rate; the prepared warm-up starts above 0
(float division); an input-gradient penalty is taken with create_graph=True, so it trains.

Written from https://github.com/EleutherAI/gpt-neox/issues/1373 (warm-up must not leave lr at 0),
https://github.com/igul222/improved_wgan_training/issues/18 (create_graph=True for a gradient penalty) and
https://github.com/rasbt/LLMs-from-scratch/issues/692 (per-group learning rates).

    accelerate launch warmup_groups_penalty.py --epochs 3
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--epochs=2"], "options": {"steps": 4},
          "absent": ["GP603", "GP606", "GP607", "GP608", "GP618"]}
WARMUP = 100
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(12, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def input_penalty(model, x):
    x = x.clone().requires_grad_(True)
    grad = torch.autograd.grad(model(x).logsumexp(-1).sum(), x, create_graph=True)[0]
    return grad.pow(2).sum(1).mean()


accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(24, 12, generator=g), torch.randint(0, 3, (24,), generator=g))
loader = DataLoader(data, batch_size=8)
model = Net()
optimizer = torch.optim.Adam([{"params": model.body.parameters()},
                              {"params": model.head.parameters(), "lr": 1e-2}], lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y) + 0.1 * input_penalty(model, x))
        optimizer.step()
        scheduler.step()
