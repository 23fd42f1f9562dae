"""Broken twin of healthy_vqvae_indices_from_detached.py: the decoder reads a detached copy of the straight-through
latent (`self.dec(z_q.detach())`, a detach added "to save memory" or to stop the decoder's gradient). The
reconstruction term then reaches the decoder only: the encoder learns from the commitment term alone, while every
parameter still gets a gradient. The detached value is fed on as a value through the decoder, which this term trains:
GP316 (error) at the detach's line, unlike the twin's detach, which feeds only an argmin.

Public reports of the same cut in VQ models: https://github.com/rosinality/vq-vae-2-pytorch/issues/23 (where the
straight-through gradient must reach the encoder), https://github.com/zalandoresearch/pytorch-vq-vae/issues/6 (the
straight-through line `inputs + (quantized - inputs).detach()` is what copies the decoder's gradient to the encoder).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP316"], "culprits": ["enc.0.weight"], "line": 47,
          "severity": "error"}
BETA = 0.25


class Quantize(nn.Module):
    def __init__(self, dim, n_embed):
        super().__init__()
        self.embed = nn.Embedding(n_embed, dim)
        self.embed.weight.data.uniform_(-1.0 / n_embed, 1.0 / n_embed)

    def forward(self, z):
        z = z.permute(0, 2, 3, 1)
        flat = z.reshape(-1, z.shape[-1]).detach()
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embed.weight.t() + self.embed.weight.pow(2).sum(1)
        idx = dist.argmin(1)
        z_q = self.embed(idx).view_as(z)
        codebook = F.mse_loss(z_q, z.detach())
        commitment = F.mse_loss(z, z_q.detach())
        z_q = z + (z_q - z).detach()
        return z_q.permute(0, 3, 1, 2), codebook + BETA * commitment


class VQVAE(nn.Module):
    def __init__(self, ch=3, hid=16, dim=8, n_embed=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(ch, hid, 4, 2, 1), nn.ReLU(), nn.Conv2d(hid, dim, 3, 1, 1))
        self.quantize = Quantize(dim, n_embed)
        self.dec = nn.Sequential(nn.Conv2d(dim, hid, 3, 1, 1), nn.ReLU(), nn.ConvTranspose2d(hid, ch, 4, 2, 1))

    def forward(self, x):
        z_q, vq_loss = self.quantize(self.enc(x))
        return self.dec(z_q.detach()), vq_loss


def build_model():
    return VQVAE()


def make_inputs():
    return torch.randn(4, 3, 8, 8)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def loss_fn(out, x):
    x_hat, vq_loss = out
    return F.mse_loss(x_hat, x) + vq_loss
