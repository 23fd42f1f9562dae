"""zero_grad() inside the micro-batch loop: only the last micro-batch's gradient reaches the step.

Public report: https://github.com/karpathy/nanoGPT/issues/206 (how accumulation must be written: one zero_grad per
optimizer step, each micro-batch's loss scaled).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP601"], "culprits": [], "line": 28, "options": {"steps": 2}}
ACCUM = 4


def build_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_inputs():
    return {"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(model, batch, optimizer):
    for x, y in zip(batch["x"].chunk(ACCUM), batch["y"].chunk(ACCUM), strict=True):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y) / ACCUM
        loss.backward()
    optimizer.step()
