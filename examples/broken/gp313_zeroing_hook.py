"""A debugging hook that zeroes the weight gradient was left in."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP313"], "culprits": ["0.weight"], "severity": "warning", "line": 10}


def build_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0].weight.register_hook(lambda g: torch.zeros_like(g))
    return model


def make_inputs():
    return torch.randn(3, 4)
