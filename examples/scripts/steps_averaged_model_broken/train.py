"""A momentum teacher kept by torch's AveragedModel beside the model, with a custom average whose momentum
schedule is counted in too few steps: tau is 1 from the second update on, so after AveragedModel's first update
(a copy of the model) the teacher is written at every step and never moves again.

Written from https://github.com/vturrisi/solo-learn/issues/286 ("it quickly reaches from 0.99 to 1 after few
epochs": the cosine tau schedule's number of steps was computed too small), in the AveragedModel form of
https://github.com/pytorch/pytorch/pull/94820 (update_parameters after each optimizer.step()).

    python train.py --steps 100
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=16)
args = parser.parse_args()
torch.manual_seed(0)
BASE_TAU = 0.9
MAX_STEPS = max(1, 64 // args.batch_size // args.batch_size)  # the bug: batches divided by the batch size again


def momentum_average(averaged, current, n):  # BYOL's cosine tau from BASE_TAU to 1 over MAX_STEPS updates
    tau = 1 - (1 - BASE_TAU) * (math.cos(math.pi * min(float(n) / MAX_STEPS, 1.0)) + 1) / 2
    return tau * averaged + (1 - tau) * current


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
teacher = AveragedModel(model, avg_fn=momentum_average)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _step in range(args.steps):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    logits = model(x)
    with torch.no_grad():
        target = teacher(x)
    loss = F.cross_entropy(logits, y) + F.mse_loss(logits.softmax(-1), target.softmax(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    teacher.update_parameters(model)
