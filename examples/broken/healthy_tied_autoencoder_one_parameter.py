"""A healthy control for gp805_tie_with_data.py: the same tied autoencoder with one Parameter, the decoder using its
transpose in the forward (F.linear(h, self.encoder.weight.t())). Both uses sum into the one .grad and Adam updates it
once: no GP805 (pytorch/xla#2719's answer: tie the Parameter, not its .data)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": [], "culprits": [], "healthy": True, "absent": ["GP805"]}


class TiedAutoencoder(nn.Module):
    def __init__(self, d=12, k=4):
        super().__init__()
        self.encoder = nn.Linear(d, k, bias=False)

    def forward(self, x):
        return F.linear(torch.tanh(self.encoder(x)), self.encoder.weight.t())


def build_model():
    return TiedAutoencoder()


def make_inputs():
    return torch.randn(8, 12)


def loss_fn(out, batch):
    return F.mse_loss(out, batch)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
