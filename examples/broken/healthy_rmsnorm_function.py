"""A healthy control for gp401_rmsnorm_backward_drops_weight.py: the same hand-written RMSNorm Function, its backward
multiplying the incoming gradient by the weight (karpathy/llm.c#763's CPU reference does the same: weight[i] *
dout[i]). Exact at the recorded weights (all ones) and at the perturbed ones: no error."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "run_gradcheck", "codes": [], "culprits": [], "healthy": True}


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x * rstd
        g = grad_out * weight
        grad_x = rstd * (g - x_hat * (g * x_hat).mean(dim=-1, keepdim=True))
        grad_weight = (grad_out * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(F.silu(self.fc1(self.norm(x))))


def build_model():
    return nn.Sequential(nn.Linear(6, 8), Block(), nn.Linear(8, 1))


def make_inputs():
    return torch.randn(4, 6)
