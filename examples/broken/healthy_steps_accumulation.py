"""Gradient accumulation done right: each micro-batch loss divided by the number of micro-batches."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}
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
        loss = F.cross_entropy(model(x), y) / ACCUM
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
