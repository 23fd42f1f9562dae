"""The loop never clears gradients: every step adds all previous steps' gradients.

Public report: https://github.com/IDEA-Research/DN-DETR/issues/19 ("It looks like you forgot optimizer.zero_grad()").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP602"], "culprits": [], "line": 27, "options": {"steps": 3}}


def build_model():
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))


def make_inputs():
    return torch.randn(10, 5), torch.randn(10, 1)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(model, batch, optimizer):
    x, y = batch
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
