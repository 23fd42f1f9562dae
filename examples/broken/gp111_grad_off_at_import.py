"""An evaluation helper switched gradients off at import time."""
import torch
import torch.nn as nn

torch.set_grad_enabled(False)  # left over from an inference script

EXPECT = {"tool": "inspect_parameters", "codes": ["GP111"], "culprits": ["0.weight"], "line": 5}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def make_inputs():
    return torch.randn(2, 4)
