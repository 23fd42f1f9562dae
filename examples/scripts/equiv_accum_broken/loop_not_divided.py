"""A plain loop accumulating --grad-accum micro-batches per optimizer step whose losses are added without dividing by
the number of micro-batches: the step gets k times the gradient of the same examples as one batch (with SGD, k times
the learning rate), and nothing raises. Written from https://github.com/karpathy/nanoGPT/issues/206 ("performs
loss.backward() without first normalizing the loss value to account for number of gradient accumulation steps").

    python loop_not_divided.py --grad-accum 4
    gradprobe check_equivalence --script loop_not_divided.py --reference-args="--grad-accum 1" -- --steps 4
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "codes": ["GP802"], "culprits": ["0.weight", "2.bias"], "line": 35,
          "args": ["--steps=4"], "options": {"reference": {"args": ["--grad-accum", "1"]}}, "ratio_is": "k"}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--grad-accum", type=int, default=4)
args = parser.parse_args()
torch.manual_seed(0)

data = TensorDataset(torch.randn(256, 6), torch.randint(0, 3, (256,)))
batches = iter(DataLoader(data, batch_size=4, shuffle=True))
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    optimizer.zero_grad()
    for x, y in itertools.islice(batches, args.grad_accum):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    optimizer.step()
