"""A fused SwiGLU Function that computes in float32 inside (`a.float()`), its backward writing the derivative of
silu(a) = a * sigmoid(a) with s where (1 - s) belongs: wrong for every element of the gate's gradient. The twin of
healthy_float32_internal_function.py: the tolerances gradcheck takes from float32 (step eps^(1/3), rtol from eps^(2/3))
keep the correct one clean, and this one still fails, at the line.

After pytorch/extension-cpp#42 (a float32-internal op whose float64 gradcheck fails on a correct backward): the check
must tell precision from a wrong derivative, not loosen itself until a real bug passes too.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP401"], "culprits": ["SwiGLUFunction", "gate.weight"], "line": 30}


class SwiGLUFunction(torch.autograd.Function):
    """out = silu(a) * b, in float32."""

    @staticmethod
    def forward(ctx, a, b):
        a32, b32 = a.float(), b.float()
        ctx.save_for_backward(a32, b32)
        s = torch.sigmoid(a32)
        return (a32 * s * b32).to(a.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        a32, b32 = ctx.saved_tensors
        g = grad_out.float()
        s = torch.sigmoid(a32)
        grad_a = g * b32 * s * (1 + a32 * s)
        grad_b = g * a32 * s
        return grad_a.to(grad_out.dtype), grad_b.to(grad_out.dtype)


class GatedMLP(nn.Module):
    def __init__(self, d=8, h=16):
        super().__init__()
        self.gate = nn.Linear(d, h)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, 1)

    def forward(self, x):
        return self.down(SwiGLUFunction.apply(self.gate(x), self.up(x))).squeeze(-1)


def build_model():
    return GatedMLP()


def make_inputs():
    return torch.randn(4, 8)
