"""mp.spawn + DDP where rank 0 alone all-reduces its loss for logging: the other rank never joins that all-reduce,
so rank 0 waits in it forever while rank 1 goes on to its step. From https://github.com/pytorch/pytorch/issues/54059
(a collective run on one rank only makes the whole job hang).

    python collective_on_one_rank.py --steps 5
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world_size, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29537")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if rank == 0:
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # rank 0 only: rank 1 never joins
            print(f"loss {logged.item() / world_size:.4f}")
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps), nprocs=2)
