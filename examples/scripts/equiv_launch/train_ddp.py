"""The training script equiv_launch/launch_torchrun.py starts with torchrun: a classifier trained with DDP, its loss
averaged over each rank's local batch (DDP averages the ranks), data sharded by a DistributedSampler. Healthy.

    torchrun --nproc_per_node=2 train_ddp.py --steps 100
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
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
