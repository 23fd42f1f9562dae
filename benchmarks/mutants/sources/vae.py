"""A small convolutional VAE on 16x16 images: reparameterised latent, Bernoulli decoder, KL term."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn as nn
import torch.nn.functional as F

LATENT = 8


class Encoder(nn.Module):
    def __init__(self, ch=8, latent=LATENT):
        super().__init__()
        self.conv1 = nn.Conv2d(1, ch, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.norm = nn.BatchNorm2d(2 * ch)
        self.mu = nn.Linear(2 * ch * 16, latent)
        self.logvar = nn.Linear(2 * ch * 16, latent)

    def forward(self, x):
        h = F.silu(self.conv1(x))
        h = F.silu(self.norm(self.conv2(h)))
        h = h.flatten(1)
        mu = self.mu(h)
        logvar = self.logvar(h).clamp(-8.0, 8.0)
        return mu, logvar


class Decoder(nn.Module):
    def __init__(self, ch=8, latent=LATENT):
        super().__init__()
        self.ch = ch
        self.fc = nn.Linear(latent, 2 * ch * 16)
        self.up1 = nn.ConvTranspose2d(2 * ch, ch, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(ch, 1, 4, stride=2, padding=1)

    def forward(self, z):
        h = self.fc(z)
        h = h.view(z.size(0), 2 * self.ch, 4, 4)
        h = F.silu(self.up1(h))
        logits = self.up2(h)
        return logits


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.log_scale = nn.Parameter(torch.zeros(1))

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        z = mu + eps * std
        return z

    def forward(self, x):
        mu, logvar = self.encoder(x)
        z = self.reparameterize(mu, logvar)
        logits = self.decoder(z) * torch.exp(self.log_scale)
        return logits, mu, logvar


def build_model():
    torch.manual_seed(0)
    model = VAE()
    return model


def make_inputs():
    return {"x": (torch.rand(8, 1, 16, 16) > 0.5).float()}


def loss_fn(out, batch):
    logits, mu, logvar = out
    rec = F.binary_cross_entropy_with_logits(logits, batch["x"], reduction="sum") / batch["x"].size(0)
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1).mean()
    loss = rec + kl
    return loss


def make_optimizer(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return optimizer


def train_step(model, batch, optimizer):
    model.train()
    out = model(batch["x"])
    loss = loss_fn(out, batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
