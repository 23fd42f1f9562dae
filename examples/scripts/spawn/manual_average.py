"""The healthy twin of spawn_broken/{sum_not_divided,not_broadcast,collective_on_one_rank}.py: mp.spawn with a
hand-written data-parallel step done right. The weights are broadcast from rank 0 at start, each gradient is
all-reduced and divided by the world size, and the loss is all-reduced for logging on every rank (only rank 0
prints it). The layout follows the manual averaging discussed in https://github.com/hpcaitech/ColossalAI/issues/3044.

    python manual_average.py --steps 5
    python manual_average.py --steps 5 --scale_loss   # the loss divided by the world size, the gradients summed
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def worker(rank, world_size, steps, scale_loss):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29538")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(42 + rank)  # a seed per rank is fine here: the broadcast below makes the weights equal
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if scale_loss:  # the loss divided by the world size: the summed gradients are then the average
            (loss / world_size).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        else:
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # every rank joins; only rank 0 prints
        if rank == 0:
            print(f"loss {logged.item() / world_size:.4f}")
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--scale_loss", action="store_true", help="divide the loss, not the summed gradients")
    args = parser.parse_args()
    mp.spawn(worker, args=(2, args.steps, args.scale_loss), nprocs=2)
