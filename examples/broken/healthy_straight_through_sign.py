"""Healthy: binarised activations trained with a clipped straight-through estimator (sign forward, surrogate backward)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP409"], "culprits": ["SignSTE"], "severity": "info", "healthy": True}


class SignSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x.abs() <= 1).to(g.dtype)


binarize = SignSTE.apply


class BinaryMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(binarize(self.fc1(x))).squeeze(-1)


def build_model():
    return BinaryMLP()


def make_inputs():
    return torch.randn(4, 6)
