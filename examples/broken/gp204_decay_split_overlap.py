"""A weight-decay split whose two name rules overlap: "decay" takes every `weight`, "no decay" takes every bias and
every norm parameter, so the LayerNorm's weight lands in both groups and torch refuses the optimizer with "some
parameters appear in more than one parameter group". The finding names the parameter, both groups, and the lines of
the helper that built each.

From public threads on that error: talkin.icu's "AdamW Optimizer: Fixing Parameter Group Errors" (MMDetection configs
whose custom groups overlap) and runebook.dev's notes on add_param_group ("ValueError: some parameters appear in more
than one parameter group" when a group repeats parameters).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP204"], "culprits": ["1.weight"], "line": 29}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def make_inputs():
    return torch.randn(3, 4)


def decay_split(model, wd=0.05):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or n.startswith("1.")]
    return [
        {"params": decay, "weight_decay": wd},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model):
    return torch.optim.AdamW(decay_split(model), lr=1e-3)
