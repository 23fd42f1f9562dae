"""A fused cubic activation whose backward drops the factor 3."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP401"], "culprits": ["CubicAct"]}


class CubicAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x + 0.1 * x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 + 0.1 * x ** 2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return CubicAct.apply(self.fc(x))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
