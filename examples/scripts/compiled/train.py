"""A plain training script whose model is compiled with torch.compile (aot_eager: no C compiler needed)."""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU())
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x)).squeeze(-1)


model = torch.compile(MLP(), backend="aot_eager")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
