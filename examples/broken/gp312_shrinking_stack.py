"""Each block scales its output by 1e-3: the first block's gradient vanishes."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP312"], "culprits": ["blocks.0.weight"], "severity": "warning"}


class Stack(nn.Module):
    def __init__(self, d=8, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(d, d) for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x)) * 1e-3
        return x


def build_model():
    return Stack()


def make_inputs():
    return torch.randn(4, 8)
