"""A healthy twin of gp702_fp16_params_underflow.py: the same denoiser with fp32 weights and its forward under
torch.autocast(bf16) on CPU, the mixed-precision recipe: the optimizer updates fp32 weights and nothing underflows.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP702"]}


class Denoiser(nn.Module):
    def __init__(self, pixels=1024, hidden=64):
        super().__init__()
        self.encoder = nn.Linear(pixels, hidden)
        self.decoder = nn.Linear(hidden, pixels)

    def forward(self, noisy):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.decoder(torch.tanh(self.encoder(noisy)))
        return out.float()


def build_model():
    torch.manual_seed(0)
    model = Denoiser()
    nn.init.normal_(model.decoder.weight, std=1e-3)
    nn.init.zeros_(model.decoder.bias)
    return model


def make_inputs():
    clean = torch.randn(32, 1024) * 1e-2
    return {"noisy": clean + 1e-3 * torch.randn(32, 1024), "clean": clean}


def loss_fn(denoised, batch):
    return F.mse_loss(denoised, batch["clean"])


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=1e-2)
