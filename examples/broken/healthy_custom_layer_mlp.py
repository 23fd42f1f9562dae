"""A healthy control: an MLP built from a hand-written layer whose weights are registered nn.Parameters."""
import math

import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class NormedLinear(nn.Module):
    """y = g * (x W^T / |W|) + b, with a learnable gain per output: every tensor it learns is an nn.Parameter."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.gain = nn.Parameter(torch.ones(n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x):
        w = self.weight / self.weight.norm(dim=1, keepdim=True)
        return self.gain * (x @ w.t()) + self.bias


class MLP(nn.Module):
    def __init__(self, sizes=(6, 12, 12, 3)):
        super().__init__()
        self.layers = nn.ModuleList(NormedLinear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.nn.functional.gelu(layer(x))
        return self.layers[-1](x) / self.log_temperature.exp()


def build_model():
    return MLP()


def make_inputs():
    return torch.randn(8, 6)


def loss_fn(out, batch):
    return out.logsumexp(dim=-1).mean() - out[:, 0].mean()


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
