"""A VQ-VAE by design: the codebook term stops the gradient to the encoder, the commitment term stops it to the
codebook, and the straight-through estimator carries the reconstruction's gradient around the lookup. The codebook
term reaches the encoder only through a stop-gradient that the commitment term trains through: GP317 (info), never a
warning or an error.

Public references: https://github.com/zalandoresearch/pytorch-vq-vae/issues/6 (`inputs + (quantized - inputs).detach()`
copies the gradient to the encoder), https://ips99.com/show/4/519485.html (`mean((z_q.detach()-z)**2) + beta *
mean((z_q - z.detach())**2)`: each term trains one side).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP317"], "culprits": ["encoder.weight"], "healthy": True,
          "severity": "info", "absent": ["GP315", "GP316"]}
BETA = 0.25


class VQVAE(nn.Module):
    def __init__(self, d=8, z=4, k=6):
        super().__init__()
        self.encoder = nn.Linear(d, z)
        self.codebook = nn.Embedding(k, z)
        self.decoder = nn.Linear(z, d)

    def forward(self, x):
        z_e = self.encoder(x)
        idx = torch.cdist(z_e, self.codebook.weight).argmin(-1)
        z_q = self.codebook(idx)
        z_st = z_e + (z_q - z_e).detach()
        return self.decoder(z_st), z_e, z_q


def build_model():
    return VQVAE()


def make_inputs():
    return torch.randn(16, 8)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def loss_fn(out, x):
    x_hat, z_e, z_q = out
    recon = F.mse_loss(x_hat, x)
    codebook = F.mse_loss(z_q, z_e.detach())
    commitment = F.mse_loss(z_e, z_q.detach())
    return recon + codebook + BETA * commitment
