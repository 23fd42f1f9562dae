"""An RMSNorm autograd.Function whose backward forgets the weight's factor in the input's gradient: exact while the
norm weight is all ones (as initialised), wrong as soon as training moves it.

After karpathy/llm.c#763 ("rmsnorm backward simple baseline kernel"), where a reviewer found the same bug in their own
RMSNorm: "I forgot to multiply by the weight in the backward pass. Spent days chasing it." A gradcheck at the recorded
call passes (weight == 1); run_gradcheck checks the Function again at the weights perturbed, and names the input and
the line.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "run_gradcheck", "codes": ["GP401"], "culprits": ["RMSNormFunction", "norm.weight"], "line": 27}


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
        grad_x = rstd * (grad_out - x_hat * (grad_out * x_hat).mean(dim=-1, keepdim=True))
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
