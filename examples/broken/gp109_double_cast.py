"""A learned offset created in float32 and cast afterwards: the cast copy is a non-leaf."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP109"], "culprits": ["offset"], "line": 12}


class Calibrator(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.fc = nn.Linear(d, d).double()
        self.offset = nn.Parameter(torch.zeros(d)).double()

    def forward(self, x):
        return self.fc(x) + self.offset


def build_model():
    return Calibrator()


def make_inputs():
    return torch.randn(3, 4, dtype=torch.float64)
