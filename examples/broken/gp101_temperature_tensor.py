"""Distillation head with a learnable temperature kept as a plain tensor."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP101"], "culprits": ["temperature"], "line": 12}


class DistillHead(nn.Module):
    def __init__(self, d=16, k=5):
        super().__init__()
        self.proj = nn.Linear(d, k)
        self.temperature = torch.ones(1, requires_grad=True)

    def forward(self, x):
        return self.proj(x) / self.temperature


def build_model():
    return DistillHead()


def make_inputs():
    return torch.randn(4, 16)
