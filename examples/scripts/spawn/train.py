"""A data-parallel script that starts its own ranks with torch.multiprocessing.spawn (gloo, CPU), healthy:
the model is seeded identically and wrapped in DDP (which broadcasts rank 0's weights and averages gradients),
each rank draws its own batches. Written after the PyTorch DDP tutorial's `mp.spawn(demo_basic, ...)` layout
(https://github.com/pytorch/pytorch/issues/54059 shows the same layout).

    python train.py --steps 5
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(x))


def worker(rank, world_size, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the data
    for _ in range(steps):
        x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world_size", type=int, default=2)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.world_size, args.steps), nprocs=args.world_size)
