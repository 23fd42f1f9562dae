"""A first layer whose ReLU is dead on every input (bias initialised far negative)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP306"], "culprits": ["0.weight", "0.bias"], "severity": "warning"}


def build_model():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    return model


def make_inputs():
    return torch.randn(6, 4)
