"""A gain registered as a buffer while meant to be learned."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP104"], "culprits": ["norm.gain"], "severity": "warning"}


class ScaledNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.register_buffer("gain", torch.ones(d, requires_grad=True))

    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True) * self.gain


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = ScaledNorm(d)

    def forward(self, x):
        return self.norm(self.fc(x))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 8)
