"""A torchrun-style FSDP2 script (`fully_shard` per block and at the root, gloo on CPU) whose loss is each rank's token
sum divided by the global token count (all-reduced without gradient), and not multiplied back by the world size:
FSDP2's reduce-scatter averages the ranks' gradients, so the gradient is 1/N of the global token mean's, and "a W-rank
run silently trains with an effective learning rate of lr / W" (https://github.com/verl-project/verl-SpeCo/pull/29;
https://github.com/ChenmienTan/RL2/issues/11 explains the multiplication). check_equivalence gathers FSDP2's gradient
shards whole (DTensor.full_tensor) and finds the 1/N against one process on the same examples. The healthy twin is
equiv_ranks/fsdp2_token_mean.py.

    torchrun --nproc_per_node=2 fsdp2_token_sum_not_scaled.py --steps 100
    gradprobe check_equivalence --script fsdp2_token_sum_not_scaled.py --world-size 2 -- --steps=4
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["embed.weight"],
          "args": ["--steps=4"], "ratio_is": "1/N", "line": 72, "options": {"compare": ["ranks"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
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
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(0)
labels = torch.randint(0, 4, (256,), generator=g)
labels[torch.rand(256, generator=g) < 0.3] = -100  # unlabelled rows: each rank's batch holds a different number
data = TensorDataset(torch.randn(256, 8, generator=g), labels)
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=True, seed=0))
for _step, (x, y) in zip(range(args.steps), loader):
    tokens = (y != -100).sum().float()
    dist.all_reduce(tokens)  # the global count, without gradient
    loss = F.cross_entropy(model(x), y, reduction="sum") / tokens  # FSDP2 averages the ranks: 1/N
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
