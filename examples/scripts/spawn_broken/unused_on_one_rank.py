"""mp.spawn + DDP where a rank-dependent branch calls an auxiliary head on rank 0 only: its parameters take part in
rank 0's loss and not rank 1's. DDP's gradient bucket is never filled on rank 1, so rank 0 waits in the backward's
all-reduce (and, with other bucket layouts, the next iteration raises "Expected to have finished reduction in the
prior iteration"). From https://github.com/Yuanhy1997/SeqDiffuSeq/issues/25 (a branch taken on some ranks only) and
https://github.com/pytorch/torchdynamo/issues/1844 (the error it raises).

    python unused_on_one_rank.py --steps 5
    python unused_on_one_rank.py --steps 5 --find_unused   # DDP handles the skipped ranks: info only
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
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.aux = nn.Linear(32, 32)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        h = self.body(x)
        if dist.get_rank() == 0:
            h = h + self.aux(h)  # the auxiliary branch runs on rank 0 only
        return self.head(h)


def worker(rank, world_size, steps, find_unused):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(Net(), find_unused_parameters=find_unused)
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
    parser.add_argument("--find_unused", action="store_true", help="DDP reduces a zero gradient for skipped ranks")
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps, args.find_unused), nprocs=2)
