"""A GAN step that never steps the discriminator's optimizer: `d_loss.backward()` gives the discriminator gradients at
every iteration, `model.opt_d.zero_grad()` clears them, and `model.opt_d.step()` is never called, so the discriminator
never moves while the generator's optimizer steps. The finding names the optimizer, its parameters, and the backward()
after which its step() is missing.

Written from zhaoyuzhi/deepfillv2 issue #6 (https://github.com/zhaoyuzhi/deepfillv2/issues/6: the discriminator's
optimizer.step() missing from the trainer) and zhaoyuzhi/DeblurGANv2-MobileNetv123-PyTorch issue #7
(https://github.com/zhaoyuzhi/DeblurGANv2-MobileNetv123-PyTorch/issues/7: "there is no call to optimizer_D1.step()").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP213"], "culprits": ["D.0.weight"], "line": 45, "options": {"steps": 4}}


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
    d_loss.backward()  # model.opt_d.step() is missing after it
    # the generator's update
    optimizer.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.D(fake), ones)
    g_loss.backward()
    optimizer.step()
    return g_loss
