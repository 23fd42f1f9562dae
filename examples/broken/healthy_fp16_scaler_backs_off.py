"""Healthy fp16 training whose first steps the GradScaler skips: its initial scale (2**16) makes the scaled gradients
overflow float16, so GradScaler.step() skips optimizer.step() and halves the scale until the gradients fit, exactly as
designed (the PyTorch AMP notes: "skipped iterations ... are expected at the start of training while the scale
calibrates"; https://github.com/pytorch/pytorch/issues/40497, "the first few iterations are skipped" with
GradScaler). The loss is finite all along, so the NaN/Inf gradients of the first step and the skipped update are
information, never an error (the same model got GP307/GP207 errors before this case was written, from the sweep's
`--wrap fp16-scaler`).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "options": {"steps": 3}}
SCALER = torch.amp.GradScaler("cpu")  # init_scale 65536


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8))


def make_inputs():
    return {"x": torch.randn(32, 16) * 4.0, "y": torch.randn(32, 8) * 50.0}


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(batch["x"]).float(), batch["y"], reduction="sum")
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
    return loss
