"""Gradient accumulation over 4 micro-batches whose losses are summed, not averaged: 4x the intended step.

Public report: https://github.com/karpathy/nanoGPT/issues/206 ("performs loss.backward() without first normalizing
the loss value to account for number of gradient accumulation steps").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP601"], "culprits": [], "line": 30, "options": {"steps": 3}}
ACCUM = 4


def build_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_inputs():
    return {"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))}


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    for x, y in zip(batch["x"].chunk(ACCUM), batch["y"].chunk(ACCUM), strict=True):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    optimizer.step()
