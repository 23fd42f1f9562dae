"""The backbone is frozen after the optimizer got all parameters (works, but often a sign of order bugs)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP203"], "culprits": ["0.weight"], "severity": "info", "healthy": True}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model[0].requires_grad_(False)
    return opt
