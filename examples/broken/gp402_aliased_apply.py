"""A clamp-and-scale op bound once at import (`clamp_scale = ClampScale.apply`); its backward forgets `limit`."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": ["GP402"], "culprits": ["ClampScale", "fc.weight"], "line": 17}


class ClampScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, limit):
        ctx.save_for_backward(x, scale)
        return x.clamp(-limit, limit) * scale

    @staticmethod
    def backward(ctx, g):
        x, scale = ctx.saved_tensors
        return g * scale, (g * x).sum(0)


clamp_scale = ClampScale.apply


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return clamp_scale(self.fc(x), self.scale, 100.0).sum(-1)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
