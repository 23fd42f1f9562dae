"""A VAE whose loss_fn returns its terms as a dict, {"recon": ..., "kl": ...}, as detection and VAE codebases do,
and whose decoder reads a detached latent: the "recon" entry never reaches the encoder while the "kl" entry does, so
every parameter gets a gradient and nothing looks broken, but the encoder learns from the KL alone. gradprobe sums the
entries as the trainer would (here every entry: no key is `loss` and none contains it) and names the entry that is cut.

Public reports: https://github.com/NVlabs/DG-Net/issues/59 ("since f is used to reconstruct images, then losses for
image reconstruction will also have no effect for Ea's updating": a reconstruction term behind a detached code, beside
terms that still train the encoder); the dict-of-losses convention is mmdetection's
https://github.com/open-mmlab/mmdetection/pull/3818 ("only values whose keys contain 'loss' will be back propagated")
and Lightning's https://github.com/Lightning-AI/pytorch-lightning/issues/7750 (a returned dict's `loss` is the total).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP316"], "culprits": ["encoder.0.weight", "mu.weight"], "line": 31,
          "severity": "error", "absent": ["GP315", "GP317"]}


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
    return {"recon": recon, "kl": 0.1 * kl}
