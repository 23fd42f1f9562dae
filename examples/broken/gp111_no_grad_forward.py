"""A forward decorated with @torch.no_grad() (copied from the predict method)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP111"], "culprits": ["fc.weight"], "line": 13}


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    @torch.no_grad()
    def forward(self, x):
        return self.fc(x)


def build_model():
    return Scorer()


def make_inputs():
    return torch.randn(2, 4)
