"""The twin of gp121_no_inputs.py: the same model with a batch, so every check that applies runs and the report is
"verified", listing what was measured (registration, optimizer coverage, the traced step, the optimizer step)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP121"]}


def build_model():
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 2))


def make_inputs():
    torch.manual_seed(0)
    return torch.randn(5, 6)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
