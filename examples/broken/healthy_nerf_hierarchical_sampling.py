"""A tiny NeRF with hierarchical sampling, as public code writes it: the coarse network's rendering weights build a
CDF along each ray, `searchsorted` draws the fine sample positions from it (inverse-CDF sampling), the samples are
detached, and the fine network is evaluated at the union of coarse and fine positions. The loss is the sum of the fine
and the coarse photometric terms. The fine term depends on the coarse network only through where the fine samples
lie, by design (the sampler learns from the coarse term alone): GP317 (info) says so, never GP316.

Written (not copied) after https://github.com/yenchenlin/nerf-pytorch (run_nerf.py: `z_samples = sample_pdf(z_vals_mid,
weights[..., 1:-1], N_importance, ...)`, then `z_samples = z_samples.detach()`, `loss = img_loss + img_loss0`) and
https://github.com/yenchenlin/nerf-pytorch/issues/18 (why the fine samples are detached from the coarse weights).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP317"], "culprits": ["coarse.body.0.weight"], "healthy": True,
          "severity": "info", "absent": ["GP315", "GP316"]}
N_COARSE, N_FINE = 8, 8


def positional(x, freqs=3):
    out = [x]
    for i in range(freqs):
        out += [torch.sin(2.0 ** i * x), torch.cos(2.0 ** i * x)]
    return torch.cat(out, -1)


class MLP(nn.Module):
    def __init__(self, d_in=21, h=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU())
        self.sigma = nn.Linear(h, 1)
        self.rgb = nn.Linear(h, 3)

    def forward(self, pts):
        h = self.body(positional(pts))
        return self.rgb(h), self.sigma(h)


def render(rgb, sigma, z_vals):
    dists = torch.cat([z_vals[..., 1:] - z_vals[..., :-1], torch.full_like(z_vals[..., :1], 1e10)], -1)
    alpha = 1.0 - torch.exp(-F.relu(sigma.squeeze(-1)) * dists)
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[..., :1]), 1.0 - alpha + 1e-10], -1), -1)[..., :-1]
    weights = alpha * trans
    return (weights[..., None] * torch.sigmoid(rgb)).sum(-2), weights


def sample_pdf(bins, weights, n):
    pdf = (weights + 1e-5) / (weights + 1e-5).sum(-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[..., :1]), torch.cumsum(pdf, -1)], -1)
    u = torch.rand(*cdf.shape[:-1], n)
    inds = torch.searchsorted(cdf, u, right=True)
    below, above = (inds - 1).clamp(min=0), inds.clamp(max=cdf.shape[-1] - 1)
    cdf_g = torch.stack([torch.gather(cdf, -1, below), torch.gather(cdf, -1, above)], -1)
    bins_g = torch.stack([torch.gather(bins, -1, below), torch.gather(bins, -1, above)], -1)
    denom = cdf_g[..., 1] - cdf_g[..., 0]
    denom = torch.where(denom < 1e-5, torch.ones_like(denom), denom)
    t = (u - cdf_g[..., 0]) / denom
    return bins_g[..., 0] + t * (bins_g[..., 1] - bins_g[..., 0])


class NeRF(nn.Module):
    def __init__(self):
        super().__init__()
        self.coarse = MLP()
        self.fine = MLP()

    def forward(self, rays_o, rays_d, near=2.0, far=6.0):
        z_vals = torch.linspace(near, far, N_COARSE).expand(rays_o.shape[0], N_COARSE)
        pts = rays_o[:, None] + rays_d[:, None] * z_vals[..., None]
        rgb_coarse, weights = render(*self.coarse(pts), z_vals)
        mids = 0.5 * (z_vals[..., 1:] + z_vals[..., :-1])
        z_samples = sample_pdf(mids, weights[..., 1:-1], N_FINE)
        z_samples = z_samples.detach()
        z_all, _ = torch.sort(torch.cat([z_vals, z_samples], -1), -1)
        pts = rays_o[:, None] + rays_d[:, None] * z_all[..., None]
        rgb_fine, _ = render(*self.fine(pts), z_all)
        return rgb_fine, rgb_coarse


def build_model():
    return NeRF()


def make_inputs():
    g = torch.Generator().manual_seed(0)
    rays_o = torch.randn(16, 3, generator=g) * 0.1
    rays_d = F.normalize(torch.randn(16, 3, generator=g), dim=-1)
    return rays_o, rays_d, torch.rand(16, 3, generator=g)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=5e-4)


def train_step(model, batch, optimizer):
    rays_o, rays_d, target = batch
    rgb_fine, rgb_coarse = model(rays_o, rays_d)
    img_loss = F.mse_loss(rgb_fine, target)
    img_loss0 = F.mse_loss(rgb_coarse, target)
    loss = img_loss + img_loss0
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
