"""A torchrun-style FSDP2 script (`fully_shard`, gloo on CPU) that shards each block but not the root: the embedding
and the head stay plain tensors that no collective touches, so their gradients are each rank's own and the ranks'
embeddings and heads drift apart from the first step. FSDP2 reduces the gradients of the modules fully_shard was
applied to, and the root call is the "outer wrapper to shard any leftover parameters"
(https://github.com/pytorch/pytorch/pull/63881, FSDP's design; the fully_shard docs,
https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html, shard the root after its submodules).

    torchrun --nproc_per_node=2 root_not_sharded.py --steps 5
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


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, d=16, classes=4):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


torch.manual_seed(0)
model = Net()
for block in model.blocks:
    fully_shard(block, mesh=mesh)
# the root is never sharded: model.embed and model.head get no gradient reduction
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(100 + rank)
for _step in range(args.steps):
    x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
