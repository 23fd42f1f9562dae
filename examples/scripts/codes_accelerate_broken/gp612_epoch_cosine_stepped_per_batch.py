"""An accelerate loop whose prepared cosine schedule is written in epochs (T_max = the number of epochs) but stepped
after every batch: the learning rate falls to its minimum after 10 batches and climbs back, again and again, inside
the first epoch.

Public reports: https://github.com/ivadomed/ivadomed/issues/57 (a CosineAnnealingLR(optimizer, num_epochs) "updated
the LR at each batch instead of each epoch, thereby unintentionally doing multiple cycles") and
https://github.com/konstmish/prodigy/issues/10 (T_max: the total steps or the epochs?).

    accelerate launch gp612_epoch_cosine_stepped_per_batch.py --epochs 10
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP612"], "culprits": [], "line": 39, "severity": "warning",
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
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        scheduler.step()
