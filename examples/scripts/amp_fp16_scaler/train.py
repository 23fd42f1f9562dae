"""The same denoiser under fp16 torch.autocast, its loss scaled by a GradScaler: healthy.

scaler.scale(loss).backward() multiplies the loss (by 65536 at first) before the backward, so the gradients that
float16 would flush to zero stay representable; scaler.step() unscales them before the update and skips a step whose
gradients overflowed. Twin of amp_fp16_no_scaler_broken; from the AMP notes of pytorch/pytorch#32140 and
engichang1467/Open-Rig3R#35 (https://github.com/engichang1467/Open-Rig3R/issues/35).

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
scaler = torch.amp.GradScaler("cpu")
for _ in range(args.steps):
    clean = torch.randn(32, 1024) * 1e-2
    noisy = clean + 1e-3 * torch.randn(32, 1024)
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(noisy).float(), clean)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
