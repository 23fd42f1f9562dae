"""A per-group learning rate written in the wrong unit: the head's lr is 1e1 where 1e-1 was meant, so every step
changes the head by more than its own weights (update/weight >= 1) while the body trains normally.

Public reports: https://github.com/MITDeepLearning/introtodeeplearning/pull/108 (a learning rate written as 1e-1 where
0.01 was meant) and https://github.com/rasbt/LLMs-from-scratch/issues/692 (a per-group learning rate set wrongly).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP618"], "culprits": ["head.weight"], "line": 34, "severity": "warning",
          "options": {"steps": 4}}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(8, 6), "y": torch.randint(0, 3, (8,))}


def make_optimizer(model):
    return torch.optim.SGD([{"params": model.body.parameters()},
                            {"params": model.head.parameters(), "lr": 1e1}], lr=1e-2)  # meant: 1e-1


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
