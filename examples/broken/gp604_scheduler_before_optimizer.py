"""scheduler.step() before optimizer.step(): the schedule's first value is skipped.

Public report: https://github.com/zju3dv/NeuralRecon/issues/51 (PyTorch's "Detected call of `lr_scheduler.step()`
before `optimizer.step()`" warning, and whether it matters).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP604"], "culprits": [], "line": 31, "severity": "warning",
          "options": {"steps": 3}}
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
    _SCHED["s"].step()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
