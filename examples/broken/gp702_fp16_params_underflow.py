"""A denoising head trained with its weights in fp16 (`model.half()`), no autocast and no GradScaler: the loss is a
mean over many pixels of small residuals, so most gradient entries fall below fp16's smallest subnormal (about 6e-8)
and flush to zero, and the optimizer updates fp16 weights with no fp32 master copy.

After engichang1467/Open-Rig3R#35 ("autocast defaults to fp16 with no GradScaler: gradients can silently underflow
to zero") and pytorch/pytorch#74739 (a pure fp16 model: its fp16 weights are what the optimizer updates, and GradScaler
refuses to unscale fp16 gradients); the mixed-precision recipe keeps weights in fp32 and runs the forward under
torch.autocast.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP702"], "culprits": ["encoder.weight"], "severity": "error"}


class Denoiser(nn.Module):
    def __init__(self, pixels=1024, hidden=64):
        super().__init__()
        self.encoder = nn.Linear(pixels, hidden)
        self.decoder = nn.Linear(hidden, pixels)

    def forward(self, noisy):
        return self.decoder(torch.tanh(self.encoder(noisy)))


def build_model():
    torch.manual_seed(0)
    model = Denoiser()
    nn.init.normal_(model.decoder.weight, std=1e-3)
    nn.init.zeros_(model.decoder.bias)
    return model.half()  # BUG: fp16 weights, no autocast, no loss scaling


def make_inputs():
    clean = torch.randn(32, 1024) * 1e-2
    return {"noisy": (clean + 1e-3 * torch.randn(32, 1024)).half(), "clean": clean.half()}


def loss_fn(denoised, batch):
    return F.mse_loss(denoised, batch["clean"])


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=1e-2)
