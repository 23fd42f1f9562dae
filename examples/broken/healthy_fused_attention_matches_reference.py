"""A healthy control for gp804_fused_attention_mask.py: the same fused causal attention with its additive mask built
with triu(diagonal=1), the reference's mask. Compared on the same weights and recorded inputs, at the recorded and at
perturbed weights: output and gradients agree to float64 rounding, and the report says what was compared and the
largest difference (keras-team/keras#23038 is the failure this pair guards against)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "run_gradcheck", "codes": [], "culprits": [], "healthy": True, "absent": ["GP804"],
          "options": {"reference": {"module": "healthy_fused_attention_matches_reference.py:FusedAttention",
                                    "replaces": "healthy_fused_attention_matches_reference.py:Attention"}}}


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
        bias = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
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
