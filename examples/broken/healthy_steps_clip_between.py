"""Clipping between backward() and step() that scales gradients down but never to zero."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 2},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 2, (6,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    optimizer.step()
