"""A healthy control: a custom autograd.Function with a correct backward for every input, inside a model."""
import torch
import torch.nn as nn

EXPECT = {"tool": "run_gradcheck", "codes": [], "culprits": [], "healthy": True}


class ScaledTanh(torch.autograd.Function):
    """y = tanh(a * x): dy/dx = a (1 - y^2), dy/da = x (1 - y^2), reduced to a's shape."""

    @staticmethod
    def forward(ctx, x, a):
        y = torch.tanh(a * x)
        ctx.save_for_backward(x, a, y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, a, y = ctx.saved_tensors
        local = grad_out * (1 - y * y)
        grad_x = local * a if ctx.needs_input_grad[0] else None
        grad_a = (local * x).sum(dim=0) if ctx.needs_input_grad[1] else None
        return grad_x, grad_a


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.slope = nn.Parameter(torch.full((4,), 0.7))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(ScaledTanh.apply(self.fc(x), self.slope))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(6, 5)
