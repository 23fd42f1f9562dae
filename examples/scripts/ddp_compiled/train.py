"""A torchrun-style DDP script (gloo) whose DDP-wrapped model is compiled (aot_eager), runnable with WORLD_SIZE=1:

    torchrun --nproc_per_node=1 train.py --steps 5

Parameter names must come without `_orig_mod.` and `module.`.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29513")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")


class Scorer(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


model = torch.compile(DDP(Scorer()), backend="aot_eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    x, y = torch.randn(8, 16), torch.rand(8)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
