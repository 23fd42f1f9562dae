"""A regression loop whose batch is drawn per step with torch.randn (no DataLoader) and whose loss is written by hand
outside any module or torch loss function: `((model(x) - y) ** 2).mean()`. gradprobe feeds the reference setup the
inputs of the model's calls and of torch's loss functions; `y` enters the loss through neither, so the two setups
cannot be given the same examples. check_equivalence refuses the comparison and names the line (`not_run`, cause
`refused`), rather than comparing gradients of different examples. Passing the target through F.mse_loss (or the
model's forward) makes it comparable.

    python loss_takes_unfed_target.py --steps 100
    gradprobe check_equivalence --script loss_takes_unfed_target.py --reference-args="--accum=1" -- --steps=4
"""

import argparse

import torch
import torch.nn as nn

EXPECT = {"tool": "check_equivalence", "refused": "accumulation", "line": 31, "args": ["--steps=4"],
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
        pred = model(x)
        loss = ((pred - y) ** 2).mean() / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
