"""The healthy twin of codes_accelerate_broken/gp606_head_attached_after_prepare: the head attached on its task's
first batch is handed to the prepared optimizer with add_param_group, so it trains.

Written from the case reported in https://github.com/Lightning-AI/pytorch-lightning/issues/16170 (a module built
after the optimizers were configured is left out of them) and the remedy the PyTorch docs give, Optimizer.add_param_group
(https://docs.pytorch.org/docs/stable/generated/torch.optim.Optimizer.add_param_group.html).

    accelerate launch head_added_to_optimizer.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "absent": ["GP606", "GP201"],
          "args": ["--epochs=1"], "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(12, 16)
        self.heads = nn.ModuleDict({"main": nn.Linear(16, 3)})

    def forward(self, x, task):
        return self.heads[task](torch.relu(self.body(x)))


accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
model = MultiTask()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _epoch in range(args.epochs):
    for step, (x, y) in enumerate(loader):
        task = "main" if step % 2 == 0 else "aux"
        if task not in model.heads:
            model.heads[task] = nn.Linear(16, 3)
            optimizer.add_param_group({"params": model.heads[task].parameters()})
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x, task), y))
        optimizer.step()
