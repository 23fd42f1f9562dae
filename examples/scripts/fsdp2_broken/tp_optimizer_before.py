"""A torchrun-style tensor-parallel script (DTensor, gloo on CPU) that builds its optimizer before
`parallelize_module`: the plan replaces the MLP's parameters with DTensor parameters (sharded by columns and by
rows), so the optimizer holds the old tensors, which get no gradient. The tensor-parallel form of
https://github.com/pytorch/pytorch/issues/149205 (the optimizer's parameters are not those of the training loop);
the TP tutorial (https://docs.pytorch.org/tutorials/intermediate/TP_tutorial.html) parallelizes first.

    torchrun --nproc_per_node=2 tp_optimizer_before.py --steps 5
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
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05)  # before parallelize_module replaces the parameters
model = parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
data = torch.Generator().manual_seed(100)  # tensor parallel: the same batch on every rank
for _step in range(args.steps):
    x = torch.randn(8, 16, generator=data)
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
