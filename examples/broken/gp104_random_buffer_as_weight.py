"""A randomly initialised projection registered as a buffer and used as a layer's weight: it never learns."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP104"], "culprits": ["proj"], "line": 13, "severity": "warning"}


class Head(nn.Module):
    def __init__(self, d=8, k=4):
        super().__init__()
        self.body = nn.Linear(12, d)
        self.register_buffer("proj", torch.randn(k, d) * 0.1)

    def forward(self, x):
        return F.linear(torch.relu(self.body(x)), self.proj)


def build_model():
    torch.manual_seed(0)
    return Head()


def make_inputs():
    return {"x": torch.randn(5, 12)}


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
