"""A torchrun-style FSDP2 script (`fully_shard`, gloo on CPU) whose auxiliary head runs on rank 0 only: the head is
sharded with the root, so its gradient reduce-scatter runs on rank 0 alone (rank 1's shard gets no gradient), and
the ranks hold different halves of a head that only rank 0 trains (here rank 1 dies in that reduce-scatter). From
https://github.com/pytorch/pytorch/pull/170667 (FSDP with "different ranks using different parameters due to model
architecture or control flow" fails in the gradient reduce-scatter; fixes pytorch/pytorch#158719) and
https://github.com/Yuanhy1997/SeqDiffuSeq/issues/25 (a rank-dependent branch that skips parameters).

    torchrun --nproc_per_node=2 unused_on_one_rank.py --steps 5
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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.aux = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.body(x))
        out = self.head(h)
        if dist.get_rank() == 0:
            out = out + self.aux(h)
        return out


torch.manual_seed(0)
model = Net()
fully_shard(model.body, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(100 + rank)
for _step in range(args.steps):
    x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
