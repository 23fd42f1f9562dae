"""A layer scale registered as a buffer (wrapped in nn.Parameter): it gets a gradient and is never optimized."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP104"], "culprits": ["block.gamma"], "line": 12, "severity": "error"}


class ScaledBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.register_buffer("gamma", nn.Parameter(torch.full((d,), 1e-2)))

    def forward(self, x):
        return x + self.gamma * self.fc(x)


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.block = ScaledBlock(d)
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        return self.out(self.block(x))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(4, 8)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
