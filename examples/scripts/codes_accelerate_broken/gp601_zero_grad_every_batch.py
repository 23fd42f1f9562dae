"""An accelerate loop that accumulates by hand (a step every 4 batches) but calls zero_grad() at the top of every batch:
each step gets only the last batch's gradient.

Public reports: https://github.com/huggingface/accelerate/issues/1299 ("when use gradient_accumulation,
optimizer.zero_grad() must be put to the end of a training iteration": at its beginning it discards the accumulated
gradient) and https://github.com/ultralytics/ultralytics/pull/11217 (a second zero_grad() that discarded batches).

    accelerate launch gp601_zero_grad_every_batch.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP601"], "culprits": [], "line": 35, "args": ["--epochs=1"],
          "options": {"steps": 2}}
ACCUM = 4
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(96, 12, generator=g), torch.randint(0, 3, (96,), generator=g))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _epoch in range(args.epochs):
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y) / ACCUM)
        if (i + 1) % ACCUM == 0:
            optimizer.step()
