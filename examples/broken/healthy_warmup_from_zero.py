"""A healthy control: a linear warm-up that starts at lr 0 and rises (`step / warmup_steps`), as nanoGPT's get_lr did
before karpathy/nanoGPT PR #578 (issue #443: "the learning rate is zero at iteration 0"). The first step moves nothing
by design: at most an info, never a warning or an error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}

WARMUP_STEPS = 100


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def make_inputs():
    return torch.randn(3, 4)


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / WARMUP_STEPS))
    return opt, sched
