"""A VQ-VAE codebook layer with a straight-through estimator, commitment loss and a tiny conv autoencoder."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn as nn
import torch.nn.functional as F


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes=16, dim=8, beta=0.25):
        super().__init__()
        self.beta = beta
        self.codebook = nn.Parameter(torch.randn(n_codes, dim) * 0.1)

    def forward(self, z):
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.size(1))
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.t() + self.codebook.pow(2).sum(1)
        idx = dist.argmin(dim=1)
        zq = self.codebook[idx].view(z.size(0), z.size(2), z.size(3), z.size(1)).permute(0, 3, 1, 2)
        codebook_loss = F.mse_loss(zq, z.detach())
        commit_loss = F.mse_loss(z, zq.detach())
        zq_st = z + (zq - z).detach()
        return zq_st, codebook_loss + self.beta * commit_loss


class VQAutoencoder(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.enc1 = nn.Conv2d(3, 16, 4, stride=2, padding=1)
        self.enc2 = nn.Conv2d(16, dim, 3, padding=1)
        self.vq = VectorQuantizer(dim=dim)
        self.dec1 = nn.ConvTranspose2d(dim, 16, 4, stride=2, padding=1)
        self.dec2 = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x):
        h = F.relu(self.enc1(x))
        z = self.enc2(h)
        zq, vq_loss = self.vq(z)
        h = F.relu(self.dec1(zq))
        recon = self.dec2(h)
        return recon, vq_loss


def build_model():
    torch.manual_seed(0)
    model = VQAutoencoder()
    return model


def make_inputs():
    return {"x": torch.randn(4, 3, 8, 8)}


def loss_fn(out, batch):
    recon, vq_loss = out
    loss = F.mse_loss(recon, batch["x"]) + vq_loss
    return loss


def make_optimizer(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    return optimizer


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    out = model(batch["x"])
    loss = loss_fn(out, batch)
    loss.backward()
    optimizer.step()
    return loss.item()
