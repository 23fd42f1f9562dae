"""Healthy twin of equiv_ranks_broken/sum_loss.py: the loss is averaged over each rank's local batch, so DDP's average
of the ranks' gradients is the gradient of the mean over the global batch, what one process computes on it.

The model has BatchNorm: each rank normalises with its own batch's statistics, by design different from one process's
statistics over the global batch. gradprobe compares both setups with BatchNorm on its running statistics (and dropout
off) and says so; the gradients then agree to float32 rounding.

    torchrun --nproc_per_node=2 mean_loss_batchnorm.py --steps 100
    gradprobe check_equivalence --script mean_loss_batchnorm.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "args": ["--steps=4"],
          "absent": ["GP801", "GP802", "GP806"]}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)

data = TensorDataset(torch.randn(64, 10), torch.randint(0, 3, (64,)))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = DDP(nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for x, y in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
