"""Mixed precision: the gradients are clipped before scaler.unscale_(), so max_norm is compared with gradients still
multiplied by the GradScaler's scale, and every step is cut to a tiny fraction of the intended update.

Public report: https://github.com/milesial/Pytorch-UNet/issues/468 ("Gradients are clipped before the unscaling":
scaler.unscale_(optimizer) should be called before gradient clipping), fixed in
https://github.com/milesial/Pytorch-UNet/pull/470.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP615"], "culprits": [], "line": 33, "options": {"steps": 3}}
SCALER = torch.amp.GradScaler("cpu", init_scale=1024.0)


def build_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_inputs():
    return {"x": torch.randn(8, 6), "y": torch.randint(0, 3, (8,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(batch["x"]), batch["y"])
    SCALER.scale(loss).backward()
    # the bug: clipping the scaled gradients (scaler.unscale_(optimizer) belongs on the line before)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    SCALER.step(optimizer)
    SCALER.update()
    return loss
