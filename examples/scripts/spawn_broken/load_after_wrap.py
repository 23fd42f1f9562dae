"""mp.spawn with DDP, where rank 0 alone loads a checkpoint into the model after wrapping it: DDP broadcast rank 0's
weights when it was built, so the load that follows leaves rank 0 with the checkpoint and rank 1 with the fresh
weights, and the ranks train different models. From https://github.com/mosaicml/composer/issues/209 (a checkpoint
loaded on rank 0 must then be shared with the other ranks) and
https://github.com/Lightning-AI/pytorch-lightning/issues/1335 (weights loaded on one rank of a DDP run).

    python load_after_wrap.py --steps 5
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
    os.environ.setdefault("MASTER_PORT", "29538")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
    if rank == 0:  # the "checkpoint": loaded on rank 0 only, after DDP's broadcast
        checkpoint = {k: v + 0.1 for k, v in model.module.state_dict().items()}
        model.module.load_state_dict(checkpoint)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps), nprocs=2)
