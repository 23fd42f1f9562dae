"""A DDP script whose batch is drawn per step with a generator of its own (no DataLoader) and whose loss is divided by
the global number of labelled rows, counted by the script itself outside the model's calls and all-reduced. gradprobe
feeds the reference the inputs of the model's and the loss function's calls; the count is computed from the reference's
own draws, which it does not feed, so the two setups divide by different numbers. The count varies with the data
(between ranks and steps): check_equivalence says the comparison was not attributable (`not_run`, cause `refused`)
instead of reporting the difference as the code's. The same script reading its batches from a DataLoader is compared:
equiv_ranks/fsdp2_token_mean.py counts from the batch gradprobe feeds.

    torchrun --nproc_per_node=2 token_count_from_own_batch.py --steps 100
    gradprobe check_equivalence --script token_count_from_own_batch.py --world-size 2 -- --steps=4
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = {"tool": "check_equivalence", "world_size": 2, "refused": "ranks", "args": ["--steps=4"],
          "options": {"compare": ["ranks"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
for _step in range(args.steps):
    x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
    y[torch.rand(16, generator=data) < 0.3] = -100  # unlabelled rows
    labelled = (y != -100).sum().float()
    dist.all_reduce(labelled)  # the global count, computed from this process's own draws
    loss = F.cross_entropy(model(x), y, reduction="sum") / labelled * world
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
