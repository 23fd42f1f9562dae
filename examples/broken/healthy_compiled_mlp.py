"""A healthy control: build_model() returns a torch.compile'd MLP (aot_eager backend, no C compiler needed).

Parameter names must come without the `_orig_mod.` prefix, and nothing may be reported.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class MLP(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.net(x))


def build_model():
    return torch.compile(MLP(), backend="aot_eager")


def make_inputs():
    return {"x": torch.randn(8, 16), "labels": torch.randint(0, 4, (8,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
