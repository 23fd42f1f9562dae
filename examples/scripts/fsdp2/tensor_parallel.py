"""A torchrun-style tensor-parallel script (DTensor, gloo on CPU), healthy: the MLP's first layer is split by
columns and the second by rows across the ranks (`parallelize_module` with ColwiseParallel/RowwiseParallel), so
their parameters are DTensors sharded on different dims, and every rank sees the same batch. Written after the
tensor-parallel tutorial's MLP (https://docs.pytorch.org/tutorials/intermediate/TP_tutorial.html), on a CPU
device mesh as in the FSDP2-on-gloo reproduction of https://github.com/pytorch/pytorch/issues/162338.

    torchrun --nproc_per_node=2 tensor_parallel.py --steps 5
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


class MLP(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


torch.manual_seed(0)
model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100)  # tensor parallel: the same batch on every rank
for _step in range(args.steps):
    x = torch.randn(8, 16, generator=data)
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
