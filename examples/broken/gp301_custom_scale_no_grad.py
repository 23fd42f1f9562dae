"""A custom scaling op whose backward forgets its learnable scale."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP301"], "culprits": ["scale"]}


class ScaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.save_for_backward(s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return g * s, None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return ScaleFn.apply(self.fc(x), self.scale)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
