"""Healthy: a parameterless positional-encoding module whose forward is decorated with no_grad.

It has nothing to train, and its output is added to trained embeddings outside the no_grad region,
so no parameter loses its gradient.
"""
import math

import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class Sinusoid(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    @torch.no_grad()
    def forward(self, positions):
        half = self.dim // 2
        freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        angles = positions.float()[:, None] * freq[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class Tagger(nn.Module):
    def __init__(self, vocab=50, dim=16, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = Sinusoid(dim)
        self.out = nn.Linear(dim, tags)

    def forward(self, ids):
        h = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        return self.out(torch.relu(h))


def build_model():
    return Tagger()


def make_inputs():
    return torch.randint(0, 50, (3, 7))
