"""A fused causal attention (one scaled_dot_product_attention call with its own additive mask) written to replace a
plain attention: its mask is built with triu(diagonal=2), so token t also attends to token t + 1. It trains, the loss
goes down faster than it should, and no gradient check of a Function can see it: nothing here has a custom backward.
run_gradcheck's `reference` option runs both on the same weights and the recorded inputs and names the mask's line.

After keras-team/keras#23038 ("MultiHeadAttention silently drops the causal mask when use_causal_mask=True and the
fused SDPA path is disabled"): a fused path and the reference path of one attention disagreed on the causal mask,
silently ("future-token leakage"), until someone compared the two.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "run_gradcheck", "codes": ["GP804"], "culprits": ["FusedAttention"], "line": 53,
          "options": {"reference": {"module": "gp804_fused_attention_mask.py:FusedAttention",
                                    "replaces": "gp804_fused_attention_mask.py:Attention"}}}


class Attention(nn.Module):
    """The reference: scores, a boolean causal mask, softmax, values."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class FusedAttention(nn.Module):
    """The replacement: one fused attention call, the causal mask as an additive bias."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        bias = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class TinyLM(nn.Module):
    def __init__(self, vocab=20, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = FusedAttention(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.embed(ids) + self.attn(self.embed(ids)))


def build_model():
    return TinyLM()


def make_inputs():
    return torch.randint(0, 20, (2, 6))
