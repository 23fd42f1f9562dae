"""Mixed precision in a plain loop: the gradients are clipped before scaler.unscale_(), so max_norm is compared with
gradients still multiplied by the GradScaler's scale, and every step is cut to a tiny fraction of the intended update.

Public report: https://github.com/milesial/Pytorch-UNet/issues/468 ("Gradients are clipped before the unscaling"),
fixed in https://github.com/milesial/Pytorch-UNet/pull/470.

    python gp615_clip_before_unscale.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP615"], "culprits": [], "line": 32, "args": ["--steps=8"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for _step in range(args.steps):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    # the bug: clipping the scaled gradients (scaler.unscale_(optimizer) belongs on the line before)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)
    scaler.update()
