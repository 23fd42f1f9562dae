"""A VQ layer whose codebook lookup is detached: the argmin that picks the codes is a selection by design (the
codebook learns through the lookup), so the cut to blame is the detach."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP302"], "culprits": ["vq.codebook"], "line": 20, "absent": ["GP305"]}


class VectorQuantizer(nn.Module):
    def __init__(self, n_codes=16, dim=8):
        super().__init__()
        self.codebook = nn.Parameter(torch.randn(n_codes, dim) * 0.1)

    def forward(self, z):
        flat = z.reshape(-1, z.size(-1))
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.t() + self.codebook.pow(2).sum(1)
        idx = dist.argmin(dim=1)
        zq = self.codebook[idx].view_as(z)
        zq = zq.detach()
        codebook_loss = F.mse_loss(zq, z.detach())
        commit_loss = F.mse_loss(z, zq.detach())
        return z + (zq - z).detach(), codebook_loss + 0.25 * commit_loss


class VQAutoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(12, 8)
        self.vq = VectorQuantizer()
        self.dec = nn.Linear(8, 12)

    def forward(self, x):
        zq, vq_loss = self.vq(self.enc(x))
        return self.dec(zq), vq_loss


def build_model():
    torch.manual_seed(0)
    return VQAutoencoder()


def make_inputs():
    return {"x": torch.randn(6, 12)}


def loss_fn(out, batch):
    recon, vq_loss = out
    return F.mse_loss(recon, batch["x"]) + vq_loss


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)
