"""A GAN trained from one summed loss with two optimizers' parameters in one model: the discriminator's term on fakes
reads them detached, the generator's term reads them live. The discriminator's term reaches the generator only through
a stop-gradient that the generator's term trains through: GP317 (info), never a warning or an error.

Public reference: https://blog.cachecha.com/csdn/Hungryof/78035332.html (detach() in GAN code: the discriminator's
loss on `fake.detach()` must not update the generator, whose own loss reads the fakes live).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP317"], "culprits": ["generator.0.weight"], "healthy": True,
          "severity": "info", "absent": ["GP315", "GP316"]}


class GAN(nn.Module):
    def __init__(self, z=4, d=6, h=16):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(z, h), nn.ReLU(), nn.Linear(h, d))
        self.discriminator = nn.Sequential(nn.Linear(d, h), nn.LeakyReLU(0.2), nn.Linear(h, 1))


def build_model():
    return GAN()


def make_inputs():
    return {"real": torch.randn(8, 6), "noise": torch.randn(8, 4)}


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=2e-4)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    fake = model.generator(batch["noise"])
    real_logits = model.discriminator(batch["real"])
    d_real = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
    fake_logits = model.discriminator(fake.detach())
    d_fake = F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    gen_logits = model.discriminator(fake)
    g_loss = F.binary_cross_entropy_with_logits(gen_logits, torch.ones_like(gen_logits))
    loss = d_real + d_fake + g_loss
    loss.backward()
    optimizer.step()
