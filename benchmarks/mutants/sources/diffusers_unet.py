"""Driver: a small denoiser around diffusers' DownBlock2D/UpBlock2D, from project-local copies of
unet_2d_blocks.py and resnet.py (the bench mutates those copies)."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn as nn
import torch.nn.functional as F

import resnet
import unet_2d_blocks


class TinyDenoiser(nn.Module):
    def __init__(self, ch=8, temb=16):
        super().__init__()
        self.time_proj = nn.Linear(1, temb)
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        self.down = unet_2d_blocks.DownBlock2D(in_channels=ch, out_channels=2 * ch, temb_channels=temb,
                                               num_layers=1, resnet_groups=4, add_downsample=True)
        self.mid = resnet.ResnetBlock2D(in_channels=2 * ch, out_channels=2 * ch, temb_channels=temb, groups=4)
        self.up = unet_2d_blocks.UpBlock2D(in_channels=2 * ch, prev_output_channel=2 * ch, out_channels=ch,
                                           temb_channels=temb, num_layers=1, resnet_groups=4, add_upsample=True)
        self.conv_out = nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, x, t):
        temb = F.silu(self.time_proj(t[:, None]))
        h = self.conv_in(x)
        h, skips = self.down(h, temb)
        h = self.mid(h, temb)
        h = self.up(h, skips[-1:], temb)
        return self.conv_out(h)


def build_model():
    torch.manual_seed(0)
    model = TinyDenoiser()
    return model


def make_inputs():
    return {"x": torch.randn(2, 3, 16, 16), "t": torch.rand(2), "noise": torch.randn(2, 3, 16, 16)}


def loss_fn(out, batch):
    loss = F.mse_loss(out, batch["noise"])
    return loss


def make_optimizer(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return optimizer


def train_step(model, batch, optimizer):
    model.train()
    optimizer.zero_grad()
    out = model(batch["x"], batch["t"])
    loss = loss_fn(out, batch)
    loss.backward()
    optimizer.step()
    return loss.item()
