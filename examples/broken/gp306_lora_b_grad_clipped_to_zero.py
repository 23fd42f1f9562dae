"""A LoRA-style adapter whose zero-initialised B never moves: a clipping callback zeroes B's gradient at every step.

B starts at zero, so at the first step A gets an exactly-zero gradient: by design only if B then moves. Here the
callback between backward() and step() clips the adapter's output projection with a clip value of 0 (a config
where 0 meant "no clipping"), so B's gradient is zero when optimizer.step() runs, B stays zero, and A never gets a
gradient either. diagnose runs real steps to check the "zero-initialised partner" claim and names the line.

Public reports: https://github.com/microsoft/LoRA/issues/59 ("the weight of A can be updated, but the weight of B
is always 0") and https://github.com/huggingface/peft/issues/793 (lora_B never updated, so the adapter changes
nothing; first read as symmetry breaking that needs more epochs).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP306"], "culprits": ["a.down.weight"], "severity": "error", "line": 47}

CONFIG = {"adapter_clip": 0.0}  # 0 meant "no clipping" in the config this was ported from


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
    torch.nn.utils.clip_grad_value_(ups, CONFIG["adapter_clip"])  # a clip value of 0 zeroes B's gradient


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
