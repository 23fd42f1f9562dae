"""A square op whose backward uses a detached input: first order right, second order wrong."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP407"], "culprits": ["Square"], "severity": "warning", "options": {"check_second_order": True}}


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x.detach()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return Square.apply(self.fc(x))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(2, 3)
