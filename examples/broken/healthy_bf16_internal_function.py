"""A healthy control: a fused GELU-gate Function that computes in bfloat16 inside whatever it is fed (`a.bfloat16()`,
cast back on return), as mixed-precision fused kernels do (Liger-Kernel, apex), with a correct backward, also in
bfloat16. gradcheck's float64 central differences see the bf16 rounding inside (about 4e-3 of the output): judged with
float64 tolerances this correct backward fails, judged with those of the dtype it computes in (measured) it passes, at
the recorded weights and at perturbed ones. check_equivalence's custom-op comparison and run_gradcheck: no error, GP405
says the tolerance it used.

Public thread: https://github.com/linkedin/Liger-Kernel/issues/90 (bf16 kernels whose gradient tests need bf16
tolerances: "the tolerance for bf16 is too tight").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "codes": [], "culprits": [], "healthy": True, "absent": ["GP401", "GP402"]}


class GeluGateBF16(torch.autograd.Function):
    """out = gelu(a) * b, computed in bfloat16: d/da = b * gelu'(a), d/db = gelu(a)."""

    @staticmethod
    def forward(ctx, a, b):
        a16, b16 = a.bfloat16(), b.bfloat16()
        ctx.save_for_backward(a16, b16)
        return (F.gelu(a16) * b16).to(a.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        a16, b16 = ctx.saved_tensors
        g = grad_out.bfloat16()
        a32 = a16.float()
        cdf = 0.5 * (1.0 + torch.erf(a32 / 2 ** 0.5))
        pdf = torch.exp(-0.5 * a32 * a32) / (2 * torch.pi) ** 0.5
        dgelu = (cdf + a32 * pdf).bfloat16()
        grad_a = g * b16 * dgelu
        grad_b = g * F.gelu(a16)
        return grad_a.to(grad_out.dtype), grad_b.to(grad_out.dtype)


class GatedMLP(nn.Module):
    def __init__(self, dim=16, hidden=32, classes=4):
        super().__init__()
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.down(GeluGateBF16.apply(self.gate(x), self.up(x)))


def build_model():
    torch.manual_seed(0)
    return GatedMLP()


def make_inputs():
    torch.manual_seed(1)
    return {"x": torch.randn(8, 16), "labels": torch.randint(0, 4, (8,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
