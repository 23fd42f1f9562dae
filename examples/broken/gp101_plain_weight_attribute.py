"""A custom linear layer whose weight is a plain tensor (no requires_grad): it is never trained."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP101"], "culprits": ["layer.weight"], "line": 12, "severity": "error"}


class MyLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.weight = torch.randn(n_out, n_in) * 0.02

    def forward(self, x):
        return x @ self.weight.t() + self.bias


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = MyLinear(8, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.layer(x)))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(5, 8)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
