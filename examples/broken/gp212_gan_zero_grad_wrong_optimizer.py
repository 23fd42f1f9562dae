"""A GAN step that clears the discriminator's optimizer twice and the generator's never: after the discriminator's
step, `model.opt_d.zero_grad()` runs where the generator's `optimizer.zero_grad()` was meant, so the generator's
gradients add up over the iterations and each of its steps uses the sum. The finding names the generator's parameters,
the backward() that added to a gradient a step had already used, and the zero_grad() line that cleared the other one.

Written from Lightning-AI/pytorch-lightning issue #591 (https://github.com/Lightning-AI/pytorch-lightning/issues/591:
"only calling optimizer.zero_grad() after optimizer.step() ... clears the gradients of Generator or Discriminator only",
leftover gradients accumulate for the other network) and opendp/smartnoise-sdk issue #280
(https://github.com/opendp/smartnoise-sdk/issues/280: a GAN's second optimizer whose zero_grad() is never called).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP212"], "culprits": ["G.0.weight"], "line": 49, "options": {"steps": 4}}


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def build_model():
    return GAN()


def make_inputs():
    return torch.randn(6, 2), torch.randn(6, 4)


def make_optimizer(model):
    model.opt_d = torch.optim.Adam(model.D.parameters(), lr=2e-4)
    return torch.optim.Adam(model.G.parameters(), lr=2e-4)


def train_step(model, batch, optimizer):
    z, real = batch
    fake = model.G(z)
    ones, zeros = torch.ones(6, 1), torch.zeros(6, 1)
    # the discriminator's update
    model.opt_d.zero_grad()
    d_loss = (F.binary_cross_entropy_with_logits(model.D(real), ones)
              + F.binary_cross_entropy_with_logits(model.D(fake.detach()), zeros))
    d_loss.backward()
    model.opt_d.step()
    # the generator's update
    model.opt_d.zero_grad()  # meant optimizer.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.D(fake), ones)
    g_loss.backward()
    optimizer.step()
    return g_loss
