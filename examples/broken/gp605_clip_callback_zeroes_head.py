"""A gradient "sanitiser" callback between backward() and step() zeroes the head's gradient by mistake.

Public report: https://github.com/OpenNMT/OpenNMT-py/issues/1140 ("the grads of parameters will be zero when set the
-max_grad_norm 0 ??"): code run between backward() and step() decides what the optimizer sees.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP605"], "culprits": ["head.weight"], "line": 33, "options": {"steps": 2}}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 2, (6,))}


def sanitise_grads(model, max_abs=1e3):
    for p in model.head.parameters():
        p.grad.mul_(p.grad.abs().max() > max_abs)  # meant: clamp huge gradients; multiplies by False (0)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    sanitise_grads(model)
    optimizer.step()
