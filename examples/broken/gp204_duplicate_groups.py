"""Layer-wise learning rates where the head appears in two groups."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP204"], "culprits": []}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    return torch.optim.AdamW([
        {"params": model.parameters(), "lr": 1e-4},
        {"params": model[2].parameters(), "lr": 1e-3},
    ])
