"""A healthy control: a fused SwiGLU Function that computes in float32 inside whatever it is fed (`a.float()`, cast
back on return), as fused kernels do, with a correct backward. gradcheck runs it on float64 copies; the float32 inside
makes central differences with a 1e-6 step noisy (about 1e-7 / 1e-6 of the output), so a plain float64 gradcheck fails on
this correct backward, the false failure pytorch/extension-cpp#42 describes for its LLTM op ("fminf and fmaxf are
casting to float32 and thus the grad_check will fail"). run_gradcheck measures the dtype the forward computes in and
takes the step and tolerances from it (GP405 says so): no error."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": [], "culprits": [], "healthy": True, "absent": ["GP401"]}


class SwiGLUFunction(torch.autograd.Function):
    """out = silu(a) * b, in float32: d/da = b * s * (1 + a * (1 - s)), d/db = silu(a), s = sigmoid(a)."""

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
        grad_a = g * b32 * s * (1 + a32 * (1 - s))
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
