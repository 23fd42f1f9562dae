"""A torchrun-style FSDP2 script (`fully_shard`, gloo on CPU) that seeds each rank with its rank before building the
model, as one does for per-rank data and dropout. DDP and FSDP1 (sync_module_states) broadcast rank 0's weights;
FSDP2's fully_shard broadcasts nothing: each rank keeps its own slice of the weights it built, so the model that
trains is pieced together from two different initialisations (no rank built it, and it changes with the world size).
From https://github.com/pytorch/torchtitan/issues/1777 ("both DDP and FSDP1 broadcast weights from rank0 ... because
each rank may have different rng"; FSDP2 does not) and https://github.com/pytorch/torchtitan/issues/166 (a model not
seeded before init, so each data-parallel rank built a different one, and FSDP never synced them).

    torchrun --nproc_per_node=2 seed_per_rank.py --steps 5               # buggy: GP704 (shards_mixed)
    torchrun --nproc_per_node=2 seed_per_rank.py --steps 5 --same_seed   # the twin: one seed for the model
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
parser.add_argument("--same_seed", action="store_true", help="build the model from one seed on every rank (the fix)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))


class Net(nn.Module):
    def __init__(self, d=16, classes=4):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.embed(x)
        return self.head(h + self.ff(h))


torch.manual_seed(0 if args.same_seed else rank)
model = Net()
fully_shard(model.ff, mesh=mesh)
fully_shard(model, mesh=mesh)
torch.manual_seed(rank)  # per-rank randomness for the data (and dropout) is fine after the model is built
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(args.steps):
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
