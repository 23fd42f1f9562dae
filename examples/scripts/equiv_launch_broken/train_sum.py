"""The training script equiv_launch_broken/launch_torchrun.py starts with torchrun: a classifier trained with DDP whose
loss is summed over each rank's local batch. DDP averages the ranks' gradients, so every example weighs 1/N of what it
weighs in one process: at 2 ranks the gradient is half the one-process gradient on the same global batch. From
https://github.com/pytorch/pytorch/issues/37359.

    torchrun --nproc_per_node=2 train_sum.py --steps 100
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 12), torch.randint(0, 3, (64,)))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    F.cross_entropy(model(x), y, reduction="sum").backward()
    optimizer.step()
dist.destroy_process_group()
