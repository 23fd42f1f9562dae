"""A torchrun-style DDP script (gloo), runnable with WORLD_SIZE=1:

    torchrun --nproc_per_node=1 train.py --steps 5
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
parser.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
args = parser.parse_args()

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29512")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")


class TwoTower(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.query = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 8))
        self.doc = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, q, d):
        doc = self.doc(d).detach()  # the document tower is cut off from the loss
        return (self.query(q) * doc).sum(-1)


model = DDP(TwoTower())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    optimizer.zero_grad()
    for micro in range(args.accum):
        q, d, y = torch.randn(8, 16), torch.randn(8, 16), torch.rand(8)
        loss = F.mse_loss(model(q, d), y) / args.accum
        loss.backward()
    optimizer.step()
dist.destroy_process_group()
