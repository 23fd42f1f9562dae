"""Healthy twin of gp902_view_instead_of_transpose.py: the activations go to the sequence-first nn.MultiheadAttention
with `.transpose(0, 1)`, so each example attends within itself (measured: every sampled output depends on its own
example only). A tagger's targets are its own positions' tags, so no causality is claimed."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP901", "GP902"]}


class Tagger(nn.Module):
    def __init__(self, vocab=64, dim=16, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, num_heads=2)
        self.out = nn.Linear(dim, tags)

    def forward(self, tokens):
        x = self.emb(tokens)
        x = x.transpose(0, 1)
        h, _ = self.attn(x, x, x)
        return self.out(h.transpose(0, 1))


def build_model():
    return Tagger()


def make_inputs():
    return {"tokens": torch.randint(0, 64, (4, 6)), "tags": torch.randint(0, 5, (4, 6))}


def loss_fn(logits, batch):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["tags"].reshape(-1))
