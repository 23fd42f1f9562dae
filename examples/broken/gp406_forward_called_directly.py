"""A custom op called through .forward instead of .apply."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP406"], "culprits": ["ShiftedSoftplus"], "line": 26}


class ShiftedSoftplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.nn.functional.softplus(x) - 0.6931

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("never reached")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        h = self.fc(x)
        h = ShiftedSoftplus.forward(None, h)
        return self.out(h)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
