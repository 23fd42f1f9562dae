"""Healthy weight-decomposed low-rank adapters on a frozen network: the up-projections start at zero.

At the first step every down-projection gets an exactly-zero gradient (the zero up-projection
multiplies it), while the up-projections get a real one. That is initialisation, not a bug: info.
The column norm is detached on purpose (the weight-decomposition trick), so the trace sees a cut
whose graph reaches both zero-gradient parameters: they must be compared by identity, never by value.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP306"], "culprits": ["down.weight"], "severity": "info", "healthy": True}


class Adapted(nn.Module):
    def __init__(self, d_in, d_out, rank=2):
        super().__init__()
        self.frozen = nn.Linear(d_in, d_out)
        self.frozen.requires_grad_(False)
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)
        nn.init.zeros_(self.up.weight)  # the adapter starts as a no-op
        self.magnitude = nn.Parameter(self.frozen.weight.detach().norm(dim=1))

    def forward(self, x):
        merged = self.frozen.weight + self.up.weight @ self.down.weight
        scale = self.magnitude / merged.norm(dim=1).detach()  # the norm is a constant for backward
        return (self.frozen(x) + self.up(self.down(x))) * scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Adapted(8, 8)
        self.b = Adapted(8, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(4, 8)


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
