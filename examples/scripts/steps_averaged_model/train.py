"""An EMA kept by torch's AveragedModel beside the model, updated after each optimizer step: healthy.

torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay)) holds a deepcopy of the model
outside it; update_parameters(model) copies the model at its first call, then moves the copy with
torch._foreach_lerp_(ema, model, 1 - decay). Written from https://github.com/pytorch/pytorch/pull/94820 (the PR that
added this EMA form; its review asks when update_parameters is to be called: after optimizer.step(), as here), beside
the broken form of https://github.com/vturrisi/solo-learn/issues/286 (a teacher that stops moving).

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--decay", type=float, default=0.9)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(args.decay))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _step in range(args.steps):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ema.update_parameters(model)
