"""A plain classifier whose loss falls on one fixed batch (the healthy twin of gp616_loss_sign_flipped.py): Adam with a
common learning rate, two loss terms returned by the step."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 2, "overfit_steps": 20},
          "absent": ["GP616"]}


def build_model():
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))


def make_inputs():
    return {"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))}


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    ce = F.cross_entropy(model(batch["x"]), batch["y"])
    l2 = 1e-4 * sum(p.square().sum() for p in model.parameters())
    (ce + l2).backward()
    optimizer.step()
    return {"loss": ce + l2, "cross_entropy": ce, "l2": l2}
