"""The healthy twin of codes_loop_broken/gp601_*: one zero_grad() per optimizer step and each of the 4 micro-batch
losses divided by 4, so the accumulated gradient is the full batch's mean gradient.

Written from https://github.com/karpathy/nanoGPT/issues/206 (how accumulation must be written).

    python accumulation_divided.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--steps=8"], "options": {"steps": 2},
          "absent": ["GP601", "GP602", "GP605"]}
ACCUM = 4
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(args.steps):
    optimizer.zero_grad()
    for _micro in range(ACCUM):
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        loss = F.cross_entropy(model(x), y) / ACCUM
        loss.backward()
    optimizer.step()
