"""A bias-add op that reduces the bias gradient over the wrong dimension."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP403"], "culprits": ["AddBias", "bias"], "line": 15}


class AddBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g.sum(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return AddBias.apply(self.fc(x), self.bias)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
