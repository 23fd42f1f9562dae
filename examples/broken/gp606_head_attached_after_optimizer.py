"""A task head created lazily at the first step, after the optimizer was built: it gets gradients, never moves.

Public report: the real-size case in gradprobe's issue 28 ("a head attached after the optimizer was built (at the
second iteration)"); the PyTorch docs' remedy is Optimizer.add_param_group:
https://docs.pytorch.org/docs/stable/generated/torch.optim.Optimizer.add_param_group.html
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP606"], "culprits": ["head.weight"], "line": 37, "options": {"steps": 3}}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 3, (6,))}


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, batch, optimizer):
    if not hasattr(model, "head"):
        model.head = nn.Linear(8, 3)  # the number of classes is known only now
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
