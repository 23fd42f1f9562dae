"""A torchrun-style DDP script (gloo) whose lateral weights also follow a local Hebbian rule, applied by hand between
the backward and optimizer.step() from each rank's own activations. DDP averages gradients only: a weight written
outside autograd is never synced, so the ranks, equal at the first forward, hold different weights at the first step
and drift apart. From https://github.com/iCog-Labs-Dev/PC-Transformers/pull/135 ("weights updated directly inside
the pc path ... bypass standard DDP gradient synchronization": the fix averages the local update across ranks).

    torchrun --nproc_per_node=2 local_update.py --steps 5          # buggy: GP704 (changed)
    torchrun --nproc_per_node=2 local_update.py --steps 5 --sync   # the twin: the update is averaged first
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--sync", action="store_true", help="average the local update across ranks (the fix)")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(12, 32)
        self.lateral = nn.Linear(32, 32, bias=False)  # trained by the loss and by a local Hebbian rule
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        self.hidden = torch.relu(self.encoder(x))
        return self.head(self.hidden + self.lateral(self.hidden))


torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
for _ in range(args.steps):
    x, y = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        h = model.module.hidden
        hebb = h.T @ h / h.shape[0]  # from this rank's batch only
        if args.sync:
            dist.all_reduce(hebb, op=dist.ReduceOp.AVG)
        model.module.lateral.weight.add_(1e-3 * hebb)
    opt.step()
dist.destroy_process_group()
