"""Healthy: a regression loop whose batch is drawn per step with torch.randn (no DataLoader), accumulated over
`--accum` micro-batches with each loss divided by the accumulation steps, the target passed to F.mse_loss. gradprobe
feeds the reference (the same loop at accumulation 1) the inputs the model's forward and F.mse_loss received, joined:
the accumulated gradient equals the gradient of the same examples as one batch. The twin that writes the loss by hand,
equiv_refused/loss_takes_unfed_target.py, cannot be fed and is refused. Written after the PyTorch AMP notes' gradient
accumulation recipe (https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation, cited in
https://github.com/karpathy/nanoGPT/pull/207).

    python loop_randn_batch.py --steps 100
    gradprobe check_equivalence --script loop_randn_batch.py --reference-args="--accum=1" -- --steps=4
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "codes": [], "healthy": True, "args": ["--steps=4"], "absent": ["GP802"],
          "options": {"compare": ["accumulation"], "reference": {"args": ["--accum=1"]}}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--accum", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(args.steps):
    for micro in range(args.accum):
        x, y = torch.randn(8, 10), torch.randn(8, 1)
        loss = F.mse_loss(model(x), y) / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
