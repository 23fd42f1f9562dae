"""A mean teacher left with requires_grad=True, outside the optimizer, whose output is not detached: it gets gradients
(unused), and its EMA update moves it at every step. Healthy: diagnose with `steps` recognises the EMA copy from what
the steps measured and raises no GP201 (without steps, one step cannot tell it from a forgotten parameter).

Public thread: https://github.com/CuriousAI/mean-teacher/issues/28 ("About EMA": a mean teacher built as a copy of the
student, updated only by `ema_param.mul_(alpha).add_(...)` after each step, whose movement had to be checked by hand);
https://github.com/lucidrains/ema-pytorch/pull/2 ("ema_model doesnt need grads"): a teacher left requiring grad.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "healthy": True, "options": {"steps": 3}, "absent": ["GP201", "GP609", "GP606"]}
DECAY = 0.99


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
    t = model.ema_teacher(batch["x"] + 0.1 * torch.randn_like(batch["x"]))
    loss = F.cross_entropy(s, batch["y"]) + F.mse_loss(s.softmax(-1), t.softmax(-1))
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for tp, sp in zip(model.ema_teacher.parameters(), model.student.parameters(), strict=True):
            tp.lerp_(sp, 1 - DECAY)
    return loss
