"""The healthy twin of steps_callback_broken: the callback between backward() and step() clips, it never zeroes.

Written from https://github.com/OpenNMT/OpenNMT-py/issues/1140 ("the grads of parameters will be zero when set the
-max_grad_norm 0 ??"): code that runs between backward() and step() decides what the optimizer sees, and a mistake
there trains nothing while the loss and the backward look normal.

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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def on_after_backward(model, max_abs=1e3):
    for p in model.head.parameters():
        p.grad.clamp_(-max_abs, max_abs)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _step in range(args.steps):
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    on_after_backward(model)
    optimizer.step()
