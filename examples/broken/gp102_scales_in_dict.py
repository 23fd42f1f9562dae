"""Per-task output scales kept in a plain dict of Parameters."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP102"], "culprits": ["scales.cls", "scales.reg"], "line": 12}


class MultiTask(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.trunk = nn.Linear(d, d)
        self.scales = {"cls": nn.Parameter(torch.ones(1)), "reg": nn.Parameter(torch.ones(1))}

    def forward(self, x):
        h = self.trunk(x)
        return h * self.scales["cls"], h * self.scales["reg"]


def build_model():
    return MultiTask()


def make_inputs():
    return torch.randn(3, 8)
