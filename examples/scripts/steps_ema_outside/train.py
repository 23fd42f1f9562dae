"""The healthy twin of steps_ema_outside_broken: the momentum teacher, held outside the model (timm's ModelEmaV2
pattern, written by hand), has its cosine tau schedule counted in optimizer steps, so it follows the model.

Written from https://github.com/vturrisi/solo-learn/issues/286 (a tau schedule counted in too few steps reaches 1
at once and the teacher stops moving).

    python train.py --steps 100
"""

import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=16)
args = parser.parse_args()
torch.manual_seed(0)


class ModelEma(nn.Module):
    """timm.utils.ModelEmaV2, by hand: a copy of the model moved toward it after each optimizer step."""

    def __init__(self, model, base_tau=0.9, max_steps=1):
        super().__init__()
        self.module = copy.deepcopy(model).eval()
        self.base_tau, self.max_steps = base_tau, max_steps

    def tau(self, step):  # BYOL's cosine schedule from base_tau to 1 over max_steps
        return 1 - (1 - self.base_tau) * (math.cos(math.pi * min(step / self.max_steps, 1.0)) + 1) / 2

    @torch.no_grad()
    def update(self, model, step):
        tau = self.tau(step)
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values(), strict=True):
            ema_v.copy_(ema_v * tau + (1.0 - tau) * model_v)


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
data = torch.randn(64, 8), torch.randint(0, 3, (64,))
batches = len(data[0]) // args.batch_size
ema = ModelEma(model, max_steps=args.steps)  # counted in optimizer steps
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    i = step % batches * args.batch_size
    x, y = data[0][i:i + args.batch_size], data[1][i:i + args.batch_size]
    logits = model(x)
    with torch.no_grad():
        target = ema.module(x)
    loss = F.cross_entropy(logits, y) + F.mse_loss(logits.softmax(-1), target.softmax(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ema.update(model, step + 1)
