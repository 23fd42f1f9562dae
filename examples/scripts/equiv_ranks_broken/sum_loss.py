"""A classifier trained with DistributedDataParallel whose loss is summed over each rank's local batch.

DDP averages the ranks' gradients, so with a summed loss every example weighs 1/N of what it weighs in one process on
the same global batch: at 2 ranks the gradient is half the one-process gradient, and the effective learning rate of
this SGD halves each time the world size doubles. Nothing raises; the loss goes down, only slower. Written from
https://github.com/pytorch/pytorch/issues/37359 ("if the loss function is MSE in sum mode, the gradient reduction should
use sum instead of mean") and https://github.com/neuralmagic/sparseml/pull/135 (DDP "won't be mathematically
equivalent to the corresponding one-process experiment").

    torchrun --nproc_per_node=2 sum_loss.py --steps 100
    gradprobe check_equivalence --script sum_loss.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["0.weight", "2.bias"],
          "line": 39, "args": ["--steps=4"], "ratio_is": "1/N"}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)

data = TensorDataset(torch.randn(64, 10), torch.randint(0, 3, (64,)))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y, reduction="sum")
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
