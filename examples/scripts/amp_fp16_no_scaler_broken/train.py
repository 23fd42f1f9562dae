"""A denoiser trained under fp16 torch.autocast with no GradScaler: the encoder's gradient underflows to zero.

The weights are fp32 and the forward runs under autocast, as it should; but the loss is a mean over many pixels of
small residuals and the decoder is initialised small, so the gradient reaching the encoder is below float16's smallest
subnormal (about 6e-8) and the backward's half-precision matmuls flush it to zero. Nothing raises; the encoder never
trains. (examples/broken/gp708_fp16_autocast_no_scaler.py is the same model in the build_model() form.)

Written from engichang1467/Open-Rig3R#35 (https://github.com/engichang1467/Open-Rig3R/issues/35, "autocast defaults
to fp16 with no GradScaler: gradients can silently underflow to zero") and the AMP notes of pytorch/pytorch#32140.

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)


class Denoiser(nn.Module):
    def __init__(self, pixels: int = 1024, hidden: int = 64) -> None:
        super().__init__()
        self.encoder = nn.Linear(pixels, hidden)
        self.decoder = nn.Linear(hidden, pixels)

    def forward(self, noisy: torch.Tensor) -> torch.Tensor:
        return self.decoder(torch.tanh(self.encoder(noisy)))


model = Denoiser()
nn.init.normal_(model.decoder.weight, std=1e-3)
nn.init.zeros_(model.decoder.bias)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for _ in range(args.steps):
    clean = torch.randn(32, 1024) * 1e-2
    noisy = clean + 1e-3 * torch.randn(32, 1024)
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):  # BUG: float16 with no GradScaler
        loss = F.mse_loss(model(noisy).float(), clean)
    loss.backward()
    optimizer.step()
