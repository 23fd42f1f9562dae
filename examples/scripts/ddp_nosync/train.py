"""A torchrun-style DDP script (gloo) with gradient accumulation under `no_sync()` that never leaves it: every
micro-batch's backward runs inside `with model.no_sync():`, so DDP never averages the accumulated gradients and each
rank steps with its own. From https://github.com/modelscope/FunASR/pull/3472 (the optimizer-step micro-batch kept
inside no_sync(), "leaving rank-local accumulated gradients") and https://github.com/pytorch/pytorch/issues/53443
(inside no_sync "each process is accumulating grads locally ... and as a result have different grads").

    torchrun --nproc_per_node=2 train.py --steps 5
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--accum", type=int, default=2)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
for _step in range(args.steps):
    opt.zero_grad()
    with model.no_sync():  # every micro-batch, the last one included: DDP never all-reduces
        for _micro in range(args.accum):
            x, y = torch.randn(8, 12, generator=data), torch.randint(0, 3, (8,), generator=data)
            (F.cross_entropy(model(x), y) / args.accum).backward()
    opt.step()
dist.destroy_process_group()
