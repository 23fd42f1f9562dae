"""A fused half-cube activation whose backward drops the 0.5 of the forward: every gradient is exactly 2x too large."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP401"], "culprits": ["HalfCube", "fc.weight"], "line": 17}


class HalfCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        grad_x = 3 * x ** 2 * g
        return grad_x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(HalfCube.apply(self.fc(x))).squeeze(-1)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
