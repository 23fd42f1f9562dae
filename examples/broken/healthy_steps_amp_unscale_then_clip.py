"""Mixed precision done right: scaler.unscale_(optimizer) before clip_grad_norm_ (the healthy twin of
gp615_clip_before_unscale.py; https://github.com/milesial/Pytorch-UNet/pull/470)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3, "overfit_steps": 20},
          "absent": ["GP615", "GP616", "GP617", "GP601", "GP602", "GP603", "GP605", "GP606", "GP607"]}
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
    SCALER.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    SCALER.step(optimizer)
    SCALER.update()
    return loss
