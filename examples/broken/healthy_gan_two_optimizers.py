"""A healthy control: a GAN with two optimizers, each over its own network's parameters, stepped in the usual order
(discriminator on detached fakes, then generator), as the answers in marcoamonteiro/pi-GAN issue #8 and
AliaksandrSiarohin/monkey-net issue #45 describe. No warning, no error.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, z):
        return self.D(self.G(z))


def build_model():
    return GAN()


def make_inputs():
    return {"z": torch.randn(8, 2), "real": torch.randn(8, 4)}


def make_optimizer(model):
    model.opt_d = torch.optim.Adam(model.D.parameters(), lr=2e-4)
    return torch.optim.Adam(model.G.parameters(), lr=2e-4)


def train_step(model, batch, optimizer):
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    fake = model.G(batch["z"])
    model.opt_d.zero_grad()
    d_loss = F.binary_cross_entropy_with_logits(model.D(batch["real"]), ones) + \
        F.binary_cross_entropy_with_logits(model.D(fake.detach()), zeros)
    d_loss.backward()
    model.opt_d.step()
    optimizer.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.D(fake), ones)
    g_loss.backward()
    optimizer.step()
    return g_loss
