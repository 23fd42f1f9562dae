"""BYOL-style momentum target whose EMA update rebinds a loop variable: the target never moves.

Public report: https://github.com/CuriousAI/mean-teacher/issues/28 ("the teacher model's weights seem to be not
updated as it performed as bad as it was first initialized").
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP609"], "culprits": ["momentum_encoder.0.weight"], "line": 21,
          "options": {"steps": 3}}
TAU = 0.99


class BYOL(nn.Module):
    def __init__(self):
        super().__init__()
        self.online = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.momentum_encoder = copy.deepcopy(self.online).requires_grad_(False)
        self.predictor = nn.Linear(4, 4)


def build_model():
    return BYOL()


def make_inputs():
    return torch.randn(6, 4)


def make_optimizer(model):
    return torch.optim.SGD(list(model.online.parameters()) + list(model.predictor.parameters()), lr=0.1)


def train_step(model, x, optimizer):
    optimizer.zero_grad()
    p = model.predictor(model.online(x + 0.1 * torch.randn_like(x)))
    with torch.no_grad():
        z = model.momentum_encoder(x + 0.1 * torch.randn_like(x))
    loss = 2 - 2 * F.cosine_similarity(p, z, dim=-1).mean()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for t, s in zip(model.momentum_encoder.parameters(), model.online.parameters(), strict=True):
            t = TAU * t + (1 - TAU) * s  # rebinds the name: the parameter is unchanged
