"""Healthy: a nanoGPT-style causal self-attention whose mask is a buffer named `bias` (a constant, not a weight)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "inspect_parameters", "codes": [], "culprits": [], "healthy": True, "absent": ["GP104"]}


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=16, n_head=2, block_size=8):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


def build_model():
    return CausalSelfAttention()


def make_inputs():
    return torch.randn(2, 8, 16)
