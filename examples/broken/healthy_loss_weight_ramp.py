"""Healthy twin of gp318_padding_mask_selects_nothing.py: an auxiliary reconstruction loss whose weight ramps up from 0
with the training step (`min(1, step / WARMUP)`). At step 0 the auxiliary head gets an exactly-zero gradient, by
design; it learns from the next step on. GP318 says so as information (the weight rises when the step counter grows),
never as a warning.

Written from a public thread on loss warm-up: layumi/Person_reID_baseline_pytorch issue #338 (a loss weight warmed up
instead of the learning rate).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP318"], "culprits": ["aux.weight", "aux.bias"], "severity": "info",
          "healthy": True}

WARMUP = 100
STATE = {"step": 0}  # the training loop's step counter


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.cls = nn.Linear(16, 3)
        self.aux = nn.Linear(16, 6)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.cls(h), self.aux(h)


def build_model():
    return TwoHeads()


def make_inputs():
    return torch.randn(8, 6), torch.randint(0, 3, (8,))


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def aux_weight(step):
    return min(1.0, step / WARMUP)


def train_step(model, batch, optimizer):
    x, y = batch
    logits, recon = model(x)
    loss = F.cross_entropy(logits, y) + aux_weight(STATE["step"]) * F.mse_loss(recon, x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    STATE["step"] += 1
    return loss
