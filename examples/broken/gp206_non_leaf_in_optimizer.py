"""The optimizer is handed a cast copy of a parameter."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP206"], "culprits": []}


def build_model():
    return nn.Linear(4, 2)


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    return torch.optim.SGD([model.weight.double(), model.bias], lr=0.1)
