"""Healthy: a custom square op called through an alias bound at import (`square = Square.apply`)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": [], "culprits": [], "healthy": True}


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


square = Square.apply


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return square(self.lin(x)).sum(-1)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
