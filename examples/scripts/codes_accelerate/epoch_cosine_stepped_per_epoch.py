"""The healthy twin of codes_accelerate_broken/gp612_epoch_cosine_stepped_per_batch: the cosine schedule written in
epochs is stepped once per epoch, after the epoch's batches. It is left out of accelerator.prepare(), whose scheduler
is stepped with the optimizer (https://github.com/huggingface/accelerate/pull/301: "This only concerns learning rate
schedulers that are called at each optimizer step, not schedulers that are called at the end of each epoch").

Written from https://github.com/ivadomed/ivadomed/issues/57.

    accelerate launch epoch_cosine_stepped_per_epoch.py --epochs 10
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "absent": ["GP612", "GP604"],
          "args": ["--epochs=10"], "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(400, 8, generator=g), torch.randint(0, 3, (400,), generator=g))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
    scheduler.step()
