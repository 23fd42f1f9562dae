"""A gated product whose backward never computes the gate's gradient."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP404"], "culprits": ["gate"], "line": 17}


class GatedMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate):
        ctx.save_for_backward(x, gate)
        return x * torch.sigmoid(gate)

    @staticmethod
    def backward(ctx, g):
        x, gate = ctx.saved_tensors
        return g * torch.sigmoid(gate), None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return GatedMul.apply(self.fc(x), self.gate)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
