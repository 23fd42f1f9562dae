"""model.parameters() consumed once for counting, then given to the optimizer empty."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP208"], "culprits": []}


def build_model():
    return nn.Linear(4, 2)


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    params = model.parameters()
    print("parameters:", sum(p.numel() for p in params))
    return torch.optim.Adam(params, lr=1e-3)
