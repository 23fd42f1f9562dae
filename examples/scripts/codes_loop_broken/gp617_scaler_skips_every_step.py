"""Mixed precision in a plain loop: the loss is inf at every step (the log of a probability that is exactly 0 for a
masked class), so the GradScaler finds inf gradients and skips every optimizer step; nothing trains.

Public report: https://github.com/deepinsight/insightface/issues/2262 ("Why Fp16 Grad Scale is 0?": "Loss nan ... Fp16
Grad Scale: 0" at every logged step).

    python gp617_scaler_skips_every_step.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP617"], "culprits": [], "line": 32, "args": ["--steps=8"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
mask = torch.tensor([1.0, 1.0, 0.0])  # class 2 is masked out, but some labels are 2
for _step in range(args.steps):
    x, y = torch.randn(8, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    optimizer.zero_grad()
    probs = model(x).softmax(-1) * mask
    loss = F.nll_loss(probs.log(), y)  # log(0) = -inf for the masked class
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
