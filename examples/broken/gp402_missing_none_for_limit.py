"""A soft clamp whose backward forgets the None for its non-tensor limit argument."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP402"], "culprits": ["SoftClamp"], "line": 18}


class SoftClamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, limit):
        ctx.save_for_backward(x)
        ctx.limit = limit
        return ctx.limit * torch.tanh(x / ctx.limit)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 - torch.tanh(x / ctx.limit) ** 2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return SoftClamp.apply(self.fc(x), 3.0)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
