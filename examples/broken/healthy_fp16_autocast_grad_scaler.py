"""The healthy twin of gp708_fp16_autocast_no_scaler.py: the same float16 autocast, with the loss scaled by a
GradScaler (the AMP recipe for float16, pytorch/pytorch#32140): the scaled gradients stay representable in the
backward's half-precision ops, and scaler.step() unscales them before the update.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP708", "GP702"]}
SCALER = torch.amp.GradScaler("cpu")


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
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(batch["noisy"]).float(), batch["clean"])
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
    return loss
