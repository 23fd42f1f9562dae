"""mp.spawn with a hand-written data-parallel step that averages gradients correctly, but seeds each rank
differently before building the model and never broadcasts the weights: the ranks start from different weights
and train different models. From https://github.com/facebookresearch/detr/issues/544 (a seed per rank before the
model is built) and https://github.com/horovod/horovod/issues/672 (gradients synced, parameters never broadcast).

    python not_broadcast.py --steps 5
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
    os.environ.setdefault("MASTER_PORT", "29536")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(42 + rank)  # a seed per rank, then the model: each rank builds different weights
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        x, y = torch.randn(16, 12), torch.randint(0, 3, (16,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps), nprocs=2)
