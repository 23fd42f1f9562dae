"""build_model fails on a shape mistake; the finding carries the user's traceback."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP100"], "culprits": []}


class Tower(nn.Module):
    def __init__(self, widths=(8, 16)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.check = self.layers[3]  # IndexError: only one layer


def build_model():
    return Tower()


def make_inputs():
    return torch.randn(2, 8)
