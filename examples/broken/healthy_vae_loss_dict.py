"""Healthy twin of gp316_vae_loss_dict_detached_latent.py: the loss_fn returns its terms as a dict, and the decoder
reads the latent itself, so both entries ("recon" and "kl") reach the encoder; facts.loss_terms names each entry by its
key, with the modules it reaches and its share of their gradient norm.

Written from https://github.com/NVlabs/DG-Net/issues/59 (the same model, with no detach on the training path); the
dict-of-losses convention is mmdetection's https://github.com/open-mmlab/mmdetection/pull/3818.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": [], "healthy": True, "absent": ["GP315", "GP316", "GP317"]}


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
        return self.decoder(z), mu, logvar


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
    return {"recon": recon, "kl": 0.1 * kl}
