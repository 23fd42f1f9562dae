"""A multi-task loop that attaches a task head at its second iteration, after the optimizer was built.

Written from the real-size case reported in gradprobe's issue 28 ("a head attached after the optimizer was built
(at the second iteration)") and the remedy the PyTorch docs give for it, Optimizer.add_param_group
(https://docs.pytorch.org/docs/stable/generated/torch.optim.Optimizer.add_param_group.html): the head gets gradients
at every step and never moves.

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.heads = nn.ModuleDict({"main": nn.Linear(16, 3)})

    def forward(self, x, task):
        return self.heads[task](torch.relu(self.body(x)))


model = MultiTask()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(args.steps):
    task = "main" if step % 2 == 0 else "aux"
    if task not in model.heads:
        model.heads[task] = nn.Linear(16, 3)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    optimizer.zero_grad()
    F.cross_entropy(model(x, task), y).backward()
    optimizer.step()
