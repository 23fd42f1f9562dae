"""A loss_fn that forgot to reduce: backward needs a scalar."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP310"], "culprits": [], "line": 27}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


def build_model():
    return Classifier()


def make_inputs():
    return {"x": torch.randn(5, 4), "y": torch.randint(0, 3, (5,))}


def loss_fn(out, batch):
    return F.cross_entropy(out, batch["y"], reduction="none")
