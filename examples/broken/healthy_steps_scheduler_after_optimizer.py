"""The same StepLR, stepped after optimizer.step()."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}
_SCHED = {}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 2, (6,))}


def make_optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _SCHED["s"] = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return opt


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
    _SCHED["s"].step()
