"""Adapters inside reentrant-checkpointed blocks fed by a frozen embedding: no gradient reaches them."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

EXPECT = {"tool": "verify_prompt_tuning", "codes": ["GP511"], "culprits": [], "line": 30}


class AdapterBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.frozen = nn.Linear(d, d).requires_grad_(False)
        self.adapter = nn.Linear(d, d, bias=False)
        nn.init.zeros_(self.adapter.weight)

    def forward(self, x):
        return torch.tanh(self.frozen(x)) + self.adapter(x)


class Model(nn.Module):
    def __init__(self, vocab=64, d=64, depth=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d).requires_grad_(False)
        self.blocks = nn.ModuleList(AdapterBlock(d) for _ in range(depth))
        self.head = nn.Linear(d, vocab).requires_grad_(False)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=True)
        return self.head(h)


def build_model():
    return Model()


def make_inputs():
    return torch.randint(0, 64, (2, 8))
