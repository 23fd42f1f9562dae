"""A head trained with a 10x larger learning rate than the body, on purpose (the healthy twin of gp618_head_lr_typo.py;
https://github.com/MITDeepLearning/introtodeeplearning/pull/108): both groups change by a small share of their weights."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 4}, "absent": ["GP618"]}


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
                            {"params": model.head.parameters(), "lr": 1e-1}], lr=1e-2)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
