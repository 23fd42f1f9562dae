"""make_optimizer raises (a typo in a keyword): reported once, as the root; the step is not run without an optimizer."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP100"], "culprits": [], "line": 24}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def make_inputs():
    return torch.randn(3, 4)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, weight_decy=0.01)
