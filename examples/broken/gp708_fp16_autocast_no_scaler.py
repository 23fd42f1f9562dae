"""A denoiser trained in mixed precision the right way round (fp32 weights, the forward under torch.autocast), but
in float16 with no GradScaler: the loss is a mean over many pixels of small residuals and the decoder is initialised
small, so the gradient reaching the encoder is below fp16's smallest subnormal (about 6e-8) and the backward's
half-precision matmuls flush it to zero. The encoder's weights get an all-zero gradient; nothing raises.

After engichang1467/Open-Rig3R#35 (https://github.com/engichang1467/Open-Rig3R/issues/35, "autocast defaults to fp16
with no GradScaler: gradients can silently underflow to zero") and the AMP notes of pytorch/pytorch#32140 (fp16
gradients of small magnitude flush to zero and the update for those parameters is lost; gradient scaling prevents it).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP708"], "culprits": ["encoder.weight"], "severity": "error"}


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
    return model


def make_inputs():
    clean = torch.randn(32, 1024) * 1e-2
    return {"noisy": clean + 1e-3 * torch.randn(32, 1024), "clean": clean}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=1e-2)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):  # BUG: float16 with no GradScaler
        loss = F.mse_loss(model(batch["noisy"]).float(), batch["clean"])
    loss.backward()
    optimizer.step()
    return loss
