"""mp.spawn with a hand-written data-parallel step (the `average_gradients` of PyTorch's "Writing Distributed
Applications" tutorial, https://pytorch.org/tutorials/intermediate/dist_tuto.html) that averages the encoder's
gradients only: the head's gradients stay each rank's own, so the ranks' heads drift apart from the first step.
As in https://github.com/horovod/horovod/issues/672 (gradients of some parameters never synchronised).

    python averages_some.py --steps 5
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def worker(rank, world_size, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29537")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for p in model.encoder.parameters():  # the head's gradients are never averaged
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps), nprocs=2)
