"""A gate created lazily on the first forward call, as a plain tensor with requires_grad=True."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP101"], "culprits": ["gate"], "line": 17}


class LazyGate(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.gate = None

    def forward(self, x):
        h = self.fc(x)
        if self.gate is None:
            self.gate = torch.ones(h.shape[-1], requires_grad=True)
        return h * torch.sigmoid(self.gate)


def build_model():
    return LazyGate()


def make_inputs():
    return torch.randn(4, 8)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)
