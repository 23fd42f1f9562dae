"""A module class that forgot super().__init__()."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP106"], "culprits": ["Regressor"]}


class Regressor(nn.Module):
    def __init__(self, d=4):
        self.fc = nn.Linear(d, 1)

    def forward(self, x):
        return self.fc(x)


def build_model():
    return Regressor()


def make_inputs():
    return torch.randn(2, 4)
