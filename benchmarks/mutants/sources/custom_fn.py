"""An MLP built on hand-written autograd Functions: a fused linear, a tanh-GELU and a straight-through quantizer."""
import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        out = x @ weight.t() + bias
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x = grad_out @ weight
        grad_w = grad_out.t() @ x
        grad_b = grad_out.sum(0)
        return grad_x, grad_w, grad_b


class TanhGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))
        return 0.5 * x * (1.0 + torch.tanh(inner))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))
        t = torch.tanh(inner)
        d_inner = math.sqrt(2.0 / math.pi) * (1.0 + 3 * 0.044715 * x.pow(2))
        grad_x = grad_out * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)
        return grad_x


class STEQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, grad_out):
        grad_x = grad_out
        return grad_x, None


class FusedLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return LinearFunction.apply(x, self.weight, self.bias)


class QuantMLP(nn.Module):
    def __init__(self, n_in=10, hidden=16, n_out=3):
        super().__init__()
        self.inp = nn.Linear(n_in, hidden)
        self.fc1 = FusedLinear(hidden, hidden)
        self.fc2 = FusedLinear(hidden, n_out)
        self.scale = 8.0

    def forward(self, x):
        h = self.inp(x)
        h = STEQuantize.apply(h, self.scale)
        h = self.fc1(h)
        h = TanhGELU.apply(h)
        out = self.fc2(h)
        return out


def gradcheck_cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    return [(LinearFunction, (x, w, b)), (TanhGELU, (x,))]


def build_model():
    torch.manual_seed(0)
    model = QuantMLP()
    return model


def make_inputs():
    return {"x": torch.randn(8, 10), "y": torch.randint(0, 3, (8,))}


def loss_fn(out, batch):
    loss = F.cross_entropy(out, batch["y"])
    return loss


def make_optimizer(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return optimizer


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    out = model(batch["x"])
    loss = loss_fn(out, batch)
    loss.backward()
    optimizer.step()
    return loss.item()
