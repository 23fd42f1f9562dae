"""Healthy twin of gp306_lora_b_grad_clipped_to_zero.py: the same LoRA-style adapter and clipping callback, with a
positive clip value. B starts at zero, A's first gradient is exactly zero, B moves at the first step and A gets a
gradient from the next: by design, checked over real steps (an info with the measurements).

Public reports the broken twin is written from: https://github.com/microsoft/LoRA/issues/59,
https://github.com/huggingface/peft/issues/793.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP306"], "culprits": ["a.down.weight"], "severity": "info", "healthy": True}

CONFIG = {"adapter_clip": 1.0}


class Adapted(nn.Module):
    def __init__(self, d_in, d_out, rank=2):
        super().__init__()
        self.frozen = nn.Linear(d_in, d_out)
        self.frozen.requires_grad_(False)
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)
        nn.init.zeros_(self.up.weight)  # B = 0: the adapter starts as a no-op

    def forward(self, x):
        return self.frozen(x) + self.up(self.down(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Adapted(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.a(x)))


def clip_adapter_grads(model):
    """Callback: clip the adapters' output projections, whose gradients spiked in an earlier run."""
    ups = [m.up.weight for m in model.modules() if isinstance(m, Adapted)]
    torch.nn.utils.clip_grad_value_(ups, CONFIG["adapter_clip"])


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(6, 8), "y": torch.randint(0, 3, (6,))}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    clip_adapter_grads(model)
    optimizer.step()
