"""A VAE whose decoder reads a detached latent: the reconstruction term never reaches the encoder, while the KL term
still does, so every parameter gets a gradient and nothing looks broken, but the encoder learns from the KL alone.

Public reports of the same cut: https://github.com/dragen1860/IntroVAE-Pytorch/issues/3 (`self.encoder(xp.detach())`
stops one term's gradient while the other terms keep training the module), https://github.com/NVlabs/DG-Net/issues/40
(a reconstruction term computed on a detached code: "this causes the vector f to have no gradient").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP316"], "culprits": ["encoder.0.weight", "mu.weight"], "line": 27,
          "severity": "error", "absent": ["GP317"]}


class VAE(nn.Module):
    def __init__(self, d=12, h=16, z=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, h), nn.ReLU())
        self.mu, self.logvar = nn.Linear(h, z), nn.Linear(h, z)
        self.decoder = nn.Sequential(nn.Linear(z, h), nn.ReLU(), nn.Linear(h, d))

    def forward(self, x):
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decoder(z.detach()), mu, logvar


def build_model():
    return VAE()


def make_inputs():
    return torch.randn(8, 12)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def loss_fn(out, x):
    x_hat, mu, logvar = out
    recon = F.mse_loss(x_hat, x)
    kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
    return recon + 0.1 * kl
