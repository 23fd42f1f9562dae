"""mp.spawn with a hand-written data-parallel step: the weights are broadcast from rank 0, each rank draws its own
batch per step (no DataLoader), and each gradient is all-reduced with the default op (SUM) and never divided by the
world size: every step uses world_size times the one-process gradient on the same global batch. From
https://github.com/hpcaitech/ColossalAI/issues/3044 ("the sum of the gradients ... require to be divided by the number
of ranks") and https://github.com/tensorflow/benchmarks/issues/466.

    python spawn_sum_not_divided.py --steps 100
    gradprobe check_equivalence --script spawn_sum_not_divided.py --reference-args="--world_size=1" -- --steps=4
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "world_size": 1, "codes": ["GP801"], "culprits": ["0.weight"], "line": 40,
          "args": ["--steps=4"], "ratio_is": "N", "spawned": 2,
          "options": {"compare": ["ranks"], "reference": {"args": ["--world_size=1"]}}}


def worker(rank, world_size, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29538")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(42 + rank)
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
            dist.all_reduce(p.grad)  # summed over the ranks, never divided by world_size
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world_size", type=int, default=2)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.world_size, args.steps), nprocs=args.world_size)
