"""A data-parallel script that starts its own ranks with torch.multiprocessing.spawn (gloo, CPU), healthy: the model is
wrapped in DDP, each rank draws its own batches per step with a generator of its own (no DataLoader), the loss is a
mean. The world size is the script's own argument, passed to its workers: the reference (one process) is the same
script with `--world_size=1`. Written after the PyTorch DDP tutorial's `mp.spawn(demo_basic, ...)` layout
(https://github.com/pytorch/pytorch/issues/54059 shows the same layout).

    python spawn_ddp.py --steps 100
    gradprobe check_equivalence --script spawn_ddp.py --reference-args="--world_size=1" -- --steps=4
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = {"tool": "check_equivalence", "world_size": 1, "codes": [], "healthy": True, "args": ["--steps=4"],
          "absent": ["GP801"], "spawned": 2, "options": {"compare": ["ranks"], "reference": {"args": ["--world_size=1"]}}}


def worker(rank, world_size, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
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
