"""The canonical step: zero_grad, forward, backward, clip, step, scheduler.step (after the optimizer)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 4},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}
_SCHED = {}


def build_model():
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))


def make_inputs():
    return torch.randn(10, 5), torch.randn(10, 1)


def make_optimizer(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _SCHED["s"] = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: (step + 1) / 10)
    return opt


def train_step(model, batch, optimizer):
    x, y = batch
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
    _SCHED["s"].step()
    return loss.item()
