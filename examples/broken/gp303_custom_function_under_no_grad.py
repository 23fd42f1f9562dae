"""A hand-written autograd.Function called inside torch.no_grad(): its output has no history."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP303"], "culprits": ["inp.weight", "inp.bias", "w"], "line": 29}


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 4)
        self.w = nn.Parameter(torch.ones(4))
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = self.inp(x)
        with torch.no_grad():
            h = Scale.apply(h, self.w)
        return self.out(h)


def build_model():
    torch.manual_seed(0)
    return Net()


def make_inputs():
    return {"x": torch.randn(5, 6)}


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
