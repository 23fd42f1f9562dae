"""A LambdaLR "linear warm-up" written with integer division: `step // warmup_steps` is 0 for every step before
warmup_steps, so the lr is 0 for the whole warm-up and nothing moves. The finding names the lambda's line.

From public threads on LambdaLR lambdas whose factor is 0 (or stuck) for every step: heyue-THU/One_Shot_Face_Reenactment
issue #10 and samet-akcay/skip-ganomaly issue #4 (a `lambda_rule` whose factor never changes with the epoch), and
karpathy/nanoGPT PR #578 (a warm-up whose factor is 0 at iteration 0).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP205"], "culprits": ["0.weight"], "line": 25,
          "severity": "warning"}

WARMUP_STEPS = 4000


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def make_inputs():
    return torch.randn(3, 4)


def warmup(step):
    return step // WARMUP_STEPS


def make_optimizer(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    return opt, sched
