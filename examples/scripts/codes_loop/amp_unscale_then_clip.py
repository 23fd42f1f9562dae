"""The healthy twin of codes_loop_broken/gp615 and gp617: scaler.unscale_(optimizer) before clip_grad_norm_, and a
finite loss (log_softmax, no log of a masked 0), so the GradScaler steps and max_norm applies to the real gradients.

Written from https://github.com/milesial/Pytorch-UNet/issues/468 (unscale before clipping) and
https://github.com/deepinsight/insightface/issues/2262 (a GradScaler that skips every step).

    python amp_unscale_then_clip.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--steps=8"], "options": {"steps": 3},
          "absent": ["GP615", "GP617", "GP602"]}
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for _step in range(args.steps):
    x, y = torch.randn(8, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)
    scaler.update()
