"""SimSiam's symmetric loss with a stop-gradient on each target branch: both terms reach the encoder and the predictor
(each through its own view), so no term is cut from a module that another trains; no warning, no error.

Public reference: https://github.com/PatrickHua/SimSiam/issues/22 ("Stop grad is implemented using the detach
operation": `D(p, z) = -cosine_similarity(p, z.detach())`, loss `D(p1, z2) / 2 + D(p2, z1) / 2`).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": [], "healthy": True, "absent": ["GP302", "GP315", "GP316"]}


class SimSiam(nn.Module):
    def __init__(self, d=10, h=16):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h))
        self.predictor = nn.Sequential(nn.Linear(h, h // 2), nn.ReLU(), nn.Linear(h // 2, h))


def build_model():
    return SimSiam()


def make_inputs():
    x = torch.randn(8, 10)
    return {"x1": x + 0.1 * torch.randn_like(x), "x2": x + 0.1 * torch.randn_like(x)}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def negative_cosine(p, z):
    return -F.cosine_similarity(p, z.detach(), dim=-1).mean()


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    z1, z2 = model.encoder(batch["x1"]), model.encoder(batch["x2"])
    p1, p2 = model.predictor(z1), model.predictor(z2)
    loss = negative_cosine(p1, z2) / 2 + negative_cosine(p2, z1) / 2
    loss.backward()
    optimizer.step()
