"""Healthy attention pooling that keeps its last attention weights on the module for inspection, diagnosed
mid-training: a forward has already run, so the attribute holds a non-leaf tensor from that forward.

The forward replaces it on every call; it is a cache, not a parameter that lost its leaf (GP109 is for that).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class AttnPool(nn.Module):
    def __init__(self, dim=12, classes=3):
        super().__init__()
        self.score = nn.Linear(dim, 1, bias=False)  # softmax ignores a shift
        self.head = nn.Linear(dim, classes)
        self.last_weights = None

    def forward(self, h):
        w = torch.softmax(self.score(h).squeeze(-1), dim=1)
        self.last_weights = w  # kept for plotting
        return self.head((w.unsqueeze(-1) * h).sum(1))


def build_model():
    model = AttnPool()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warm = model(torch.randn(4, 5, 12)).logsumexp(-1).mean()  # training already under way
    warm.backward()
    opt.step()
    opt.zero_grad()
    return model


def make_inputs():
    return torch.randn(4, 5, 12)


def loss_fn(out, batch):
    return nn.functional.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long))
