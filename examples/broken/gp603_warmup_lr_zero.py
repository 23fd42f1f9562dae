"""A warm-up lambda with integer division: the learning rate is 0 for the first 100 steps.

Public reports: https://github.com/EleutherAI/gpt-neox/issues/1373 (warm-up leaves lr at 0 for the first step, so
step 1 equals step 0) and https://github.com/karpathy/nanoGPT/pull/578 (non-zero lr at iteration 0).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP603"], "culprits": ["body.weight"], "line": 35, "options": {"steps": 4}}
WARMUP = 100
SCHEDULERS = []  # the training loop keeps its scheduler


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
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step // WARMUP))
    SCHEDULERS.append(sched)
    return opt, sched


def loss_fn(out, batch):
    return F.cross_entropy(out, batch["y"])
