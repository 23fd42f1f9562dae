"""Everything frozen after loading "pretrained" weights, including what should learn."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP110"], "culprits": ["0.weight"], "line": 10}


def build_model():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    model.requires_grad_(False)
    return model


def make_inputs():
    return torch.randn(2, 4)
