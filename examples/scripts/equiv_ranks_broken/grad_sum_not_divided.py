"""Data parallelism written by hand: the ranks start from rank 0's weights and all-reduce their gradients before
each step, with torch.distributed's default op, SUM, and no division by the world size. Every step is N times the
one-process step on the same global batch. Written from https://github.com/pytorch/pytorch/issues/37359 (DDP averages,
a hand-written reduction must too) and the PyTorch distributed tutorial's average_gradients
(https://pytorch.org/tutorials/intermediate/dist_tuto.html: "param.grad.data /= size"). gradprobe's diagnose names
the same all-reduce as GP705 at the step; check_equivalence measures the ratio against one process.

    torchrun --nproc_per_node=2 grad_sum_not_divided.py --steps 100
    gradprobe check_equivalence --script grad_sum_not_divided.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["0.weight", "2.bias"],
          "line": 41, "args": ["--steps=4"], "ratio_is": "N"}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--average", action="store_true", help="divide the summed gradients by the world size")
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)

data = TensorDataset(torch.randn(64, 10), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
for p in model.parameters():
    dist.broadcast(p.data, src=0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        if args.average:
            p.grad /= dist.get_world_size()
    optimizer.step()
dist.destroy_process_group()
