"""An EMA copy under a neutral attribute name (`self.b`), updated in place with a decay of 1.0: every step writes into
its tensors (mul_/add_) and none changes them. Recognised by what the steps measure (a copy of `a` outside the
optimizer, written at every step, its values unchanged), not by its name.

Public report: https://github.com/huggingface/pytorch-image-models/issues/1831 ("ModelEma doesn't update"): an EMA
update that runs at every step and leaves the copy where it started.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP609"], "culprits": ["b.0.weight"], "line": 23,
          "options": {"steps": 3}}
DECAY = 1.0  # meant 0.999: with 1.0 the update keeps all of the copy and none of the student


class TwoNets(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.b = copy.deepcopy(self.a).requires_grad_(False)


def build_model():
    return TwoNets()


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 3, (6,))}


def make_optimizer(model):
    return torch.optim.SGD(model.a.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    s = model.a(batch["x"])
    with torch.no_grad():
        t = model.b(batch["x"])
    loss = F.cross_entropy(s, batch["y"]) + F.mse_loss(s.softmax(-1), t.softmax(-1))
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for tp, sp in zip(model.b.parameters(), model.a.parameters(), strict=True):
            tp.mul_(DECAY).add_(sp, alpha=1 - DECAY)
    return loss
