"""mp.spawn with a hand-written data-parallel step: the weights are broadcast from rank 0, and each gradient is
all-reduced with the default op (SUM) and never divided by the world size, so every step uses world_size times the
average gradient. From https://github.com/hpcaitech/ColossalAI/issues/3044 ("the sum of the gradients ... require to
be divided by the number of ranks") and https://github.com/tensorflow/benchmarks/issues/466 (summed, not averaged).

    python sum_not_divided.py --steps 5
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def worker(rank, world_size, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29535")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # a sum over the ranks, never divided by world_size
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps), nprocs=2)
