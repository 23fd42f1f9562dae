"""zero_grad() sits between backward() and step(): the update is always zero."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP207"], "culprits": ["0.weight", "2.weight"], "line": 24}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 2, (6,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    loss = F.cross_entropy(model(batch["x"]), batch["y"])
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    return loss.item()
