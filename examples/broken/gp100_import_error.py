"""A training script that imports a package the environment lacks."""
import torch
import torch.nn as nn
import not_installed_anywhere  # noqa: F401

EXPECT = {"tool": "inspect_parameters", "codes": ["GP100"], "culprits": []}


def build_model():
    return nn.Linear(2, 2)


def make_inputs():
    return torch.randn(1, 2)
