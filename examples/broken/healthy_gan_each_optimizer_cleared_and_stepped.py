"""The healthy twin of gp212_gan_zero_grad_wrong_optimizer.py and gp213_discriminator_never_stepped.py: each network's
optimizer is cleared before its own loss's backward() and stepped after it (the DCGAN loop; Lightning-AI/pytorch-lightning
issue #591). No error.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 4},
          "absent": ["GP212", "GP213", "GP602", "GP606"]}


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
    optimizer.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.D(fake), ones)
    g_loss.backward()
    optimizer.step()
    return g_loss
