"""A script that measures a baseline accuracy before training; its evaluate() leaves the model in eval mode.

Written from https://github.com/fartashf/vsepp/issues/4 (validation "will not call model.train_start() until next
epoch", so dropout and batch norm stay in inference mode while training) and
https://github.com/facebookresearch/clevr-iep/pull/22 (an accuracy check that forgets to set train mode back).

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
val_x, val_y = torch.randn(64, 8), torch.randint(0, 3, (64,))


def evaluate(model):
    model.eval()
    with torch.no_grad():
        return (model(val_x).argmax(1) == val_y).float().mean().item()


print(f"baseline accuracy {evaluate(model):.3f}")
for _step in range(args.steps):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
print(f"final accuracy {evaluate(model):.3f}")
