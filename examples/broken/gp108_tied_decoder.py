"""A tiny autoencoder whose decoder reuses the encoder matrix (tied on purpose)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "inspect_parameters", "codes": ["GP108"], "culprits": ["enc.weight", "dec.weight"], "severity": "info", "healthy": True}


class TiedAE(nn.Module):
    def __init__(self, d=8, k=3):
        super().__init__()
        self.enc = nn.Linear(d, k, bias=False)
        self.dec = nn.Linear(k, d, bias=False)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return F.linear(self.enc(x), self.dec.weight.t())


def build_model():
    return TiedAE()


def make_inputs():
    return torch.randn(4, 8)
