"""A pre-norm residual block written with +=: the in-place add modifies the input the norm saved."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP308"], "culprits": [], "line": 17}


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x * 1.0  # a fresh tensor: the input batch stays untouched
        for _ in range(2):
            x += self.mlp(self.norm(x))
        return x


def build_model():
    return Block()


def make_inputs():
    return torch.randn(4, 8)
