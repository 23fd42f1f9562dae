"""Mean teacher built inside the model and handed to the optimizer with model.parameters(); its output feeds the
consistency loss with grad enabled, so the optimizer trains the teacher as well as the EMA.

Public report: https://github.com/CuriousAI/mean-teacher/issues/28 (the teacher's weights must follow the student
only through the EMA update).
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP609"], "culprits": ["ema_teacher.0.weight"], "line": 34,
          "options": {"steps": 3}}
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
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    s = model.student(batch["x"])
    t = model.ema_teacher(batch["x"] + 0.1 * torch.randn_like(batch["x"]))
    loss = F.cross_entropy(s, batch["y"]) + F.mse_loss(s.softmax(-1), t.softmax(-1))
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for tp, sp in zip(model.ema_teacher.parameters(), model.student.parameters(), strict=True):
            tp.mul_(DECAY).add_(sp, alpha=1 - DECAY)
