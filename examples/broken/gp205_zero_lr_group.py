"""A warm-up schedule that left the encoder group at lr 0."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP205", "GP207"], "culprits": ["0.weight"], "line": 17}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    return torch.optim.SGD([
        {"params": model[0].parameters(), "lr": 0.0},
        {"params": model[2].parameters(), "lr": 0.1},
    ])
