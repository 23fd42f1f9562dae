"""The loss cannot go down even on one fixed batch: the step minimises the negative of the classification loss (a sign
flipped when a log-likelihood objective was turned into a loss), so every update makes the fit worse, while every
parameter gets a gradient and moves.

Public report: https://github.com/Ontheway361/antispoof-single-image/issues/12 ("The model loss is not decreasing even
when I try to overfit batches of data"); overfitting one batch as the first check:
https://github.com/victoresque/pytorch-template/pull/69.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP616"], "culprits": [], "line": 29,
          "options": {"steps": 2, "overfit_steps": 20}}


def build_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_inputs():
    return {"x": torch.randn(8, 6), "y": torch.randint(0, 3, (8,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    log_likelihood = -F.cross_entropy(model(batch["x"]), batch["y"])
    log_likelihood.backward()  # meant: (-log_likelihood).backward(); as written it minimises the likelihood
    optimizer.step()
    return {"loss": -log_likelihood.detach(), "log_likelihood": log_likelihood.detach()}
