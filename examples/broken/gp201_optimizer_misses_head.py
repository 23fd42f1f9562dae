"""The optimizer is built from the encoder only; the new head never learns."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP201"], "culprits": ["head.weight", "head.bias"], "line": 28}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(5, 6), "y": torch.randint(0, 3, (5,))}


def make_optimizer(model):
    return torch.optim.SGD(model.encoder.parameters(), lr=0.1)


def loss_fn(out, batch):
    return F.cross_entropy(out, batch["y"])
