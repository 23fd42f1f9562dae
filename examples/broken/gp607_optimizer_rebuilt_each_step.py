"""An Adam optimizer built inside the step: its moments and step count restart every step.

Public write-up: https://www.codegenes.net/blog/pytorch-reset-optimizer (re-initialising the optimizer is how Adam's
state is reset: done in the loop, every step starts from empty state).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP607"], "culprits": [], "line": 22, "options": {"steps": 3}}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 2, (6,))}


def train_step(model, batch, optimizer):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
