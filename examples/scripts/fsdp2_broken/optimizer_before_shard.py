"""A torchrun-style FSDP2 script (`fully_shard`, gloo on CPU) that builds its optimizer BEFORE sharding the model:
fully_shard replaces every parameter by a new DTensor parameter, so the optimizer holds the old, plain tensors, which
never get a gradient, and the model never trains. From https://github.com/pytorch/pytorch/issues/149205 (FSDP2
parameters not updating: "the parameters captured by the optimizer seem to differ from those in the training loop")
and https://github.com/mosaicml/composer/pull/3822 (after fully_shard, the optimizer's params must be pointed at the
DTensors).

    torchrun --nproc_per_node=2 optimizer_before_shard.py --steps 5
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # before fully_shard: holds the tensors it is about to replace
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
data = torch.Generator().manual_seed(100 + rank)
for _step in range(args.steps):
    x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
