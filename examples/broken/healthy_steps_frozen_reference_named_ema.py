"""A DPO-style frozen reference model that happens to be called `ema_model`: a copy of the policy, outside the
optimizer, used under no_grad for the reference log-probabilities and never written. The steps measure that nothing
writes it and no update is computed for it: a frozen copy by design, not a broken EMA (at most an info).

Public thread: https://github.com/huggingface/trl/issues/1104 (the DPO reference model is a deepcopy of the model,
kept frozen so that the policy is measured against a fixed baseline).
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608"]}
BETA = 0.1


class PolicyWithReference(nn.Module):
    def __init__(self):
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5))
        self.ema_model = copy.deepcopy(self.policy).requires_grad_(False)


def build_model():
    return PolicyWithReference()


def make_inputs():
    return {"x": torch.randn(6, 4), "chosen": torch.randint(0, 5, (6,)), "rejected": torch.randint(0, 5, (6,))}


def _logps(logits, batch):
    logp = logits.log_softmax(-1)
    return logp.gather(1, batch["chosen"][:, None]).squeeze(1), logp.gather(1, batch["rejected"][:, None]).squeeze(1)


def make_optimizer(model):
    return torch.optim.SGD(model.policy.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    pc, pr = _logps(model.policy(batch["x"]), batch)
    with torch.no_grad():
        rc, rr = _logps(model.ema_model(batch["x"]), batch)
    loss = -F.logsigmoid(BETA * ((pc - rc) - (pr - rr))).mean()
    loss.backward()
    optimizer.step()
    return loss
