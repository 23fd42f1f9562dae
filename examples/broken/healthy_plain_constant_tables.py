"""Constant tables kept as plain tensor attributes (positions, a causal mask): at most a warning, never an error."""
import math

import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class TinyAttention(nn.Module):
    def __init__(self, d=8, n=6):
        super().__init__()
        pos = torch.arange(n).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(n, d)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.pe = pe
        self.causal = torch.tril(torch.ones(n, n)).view(1, n, n)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        x = x + self.pe[: x.shape[1]]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(self.causal[:, : x.shape[1], : x.shape[1]] == 0, float("-inf"))
        return self.out(torch.softmax(att, dim=-1) @ v)


def build_model():
    return TinyAttention()


def make_inputs():
    return torch.randn(2, 6, 8)
