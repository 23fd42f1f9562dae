"""A mean teacher outside the optimizer (requires_grad left True, output under no_grad), moved by its EMA each step."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}
DECAY = 0.9


class MeanTeacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.ema_teacher = copy.deepcopy(self.student)


def build_model():
    return MeanTeacher()


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 3, (6,))}


def make_optimizer(model):
    return torch.optim.SGD(model.student.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    s = model.student(batch["x"])
    with torch.no_grad():
        t = model.ema_teacher(batch["x"] + 0.1 * torch.randn_like(batch["x"]))
    loss = F.cross_entropy(s, batch["y"]) + F.mse_loss(s.softmax(-1), t.softmax(-1))
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for tp, sp in zip(model.ema_teacher.parameters(), model.student.parameters(), strict=True):
            tp.lerp_(sp, 1 - DECAY)
