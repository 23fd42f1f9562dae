"""A frozen "reference" projection made with nn.Parameter(w.data, requires_grad=False) and left out of the optimizer:
it shares the trained projection's storage, so it is no snapshot, it follows every update. That is what some code
means (a view kept for reading), so it is reported as info only (GP805, frozen), never an error: nothing is split or
updated twice. The twin of gp805_tie_with_data.py where only one side trains."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP805"], "culprits": ["ref_proj", "proj.weight"],
          "severity": "info", "healthy": True}


class Student(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.ref_proj = nn.Parameter(self.proj.weight.data, requires_grad=False)
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        return self.out(torch.relu(self.proj(x))).squeeze(-1) + 0.0 * (x @ self.ref_proj).sum(-1)


def build_model():
    return Student()


def make_inputs():
    return {"x": torch.randn(6, 8), "y": torch.randn(6)}


def loss_fn(out, batch):
    return F.mse_loss(out, batch["y"])


def make_optimizer(model):
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
