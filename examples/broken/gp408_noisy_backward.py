"""A backward that adds a tiny random jitter "for regularisation"."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP408"], "culprits": ["JitterGrad"], "severity": "warning"}


class JitterGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g + 1e-9 * torch.randn_like(g)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return JitterGrad.apply(self.fc(x))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(2, 3)
