"""Healthy token tagger whose encoder also computes a pooled summary that this loss never uses.

The pooler runs in forward (it is read) but nothing from it reaches the loss, so its parameters get
no gradient. That is worth knowing (DDP needs find_unused_parameters=True; maybe drop the pooler),
but it does not stop the model from learning what the loss asks: a warning, not an error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP301"], "culprits": ["encoder.pooler.weight"], "severity": "warning", "healthy": True}


class Encoder(nn.Module):
    def __init__(self, vocab=40, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.pooler = nn.Linear(dim, dim)

    def forward(self, ids):
        h = torch.relu(self.mix(self.embed(ids)))
        return {"hidden": h, "pooled": torch.tanh(self.pooler(h[:, 0]))}


class Tagger(nn.Module):
    def __init__(self, tags=4):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(16, tags)

    def forward(self, ids, labels):
        logits = self.head(self.encoder(ids)["hidden"])
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def build_model():
    return Tagger()


def make_inputs():
    return {"ids": torch.randint(0, 40, (3, 6)), "labels": torch.randint(0, 4, (3, 6))}


def loss_fn(out, batch):
    return out
