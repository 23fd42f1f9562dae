"""The same denoiser under bfloat16 torch.autocast, with no GradScaler: healthy.

bfloat16 keeps float32's 8-bit exponent, so the small gradients that float16 flushes to zero stay representable and
no loss scaling is needed. Twin of amp_fp16_no_scaler_broken; from decoderesearch/SAELens#723
(https://github.com/decoderesearch/SAELens/issues/723: bfloat16 has fp32's exponent range, nothing to scale).

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
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.mse_loss(model(noisy).float(), clean)
    loss.backward()
    optimizer.step()
