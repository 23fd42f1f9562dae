"""re-initialising a layer by replacing its Parameter after the optimizer exists."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP202"], "culprits": ["proj.weight"], "line": 19}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)


def build_model():
    model = Model()
    # orthogonal re-init "the easy way"
    w = torch.empty(4, 4)
    model.proj.weight = nn.Parameter(nn.init.orthogonal_(w))
    return model


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    return model.optimizer


def loss_fn(out, batch):
    return out.pow(2).mean()
