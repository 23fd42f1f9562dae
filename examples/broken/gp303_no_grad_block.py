"""A "cheap" context encoder run under no_grad inside the training forward."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP303"], "culprits": ["context.weight", "context.bias"], "line": 15}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.context = nn.Linear(4, 4)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        with torch.no_grad():
            c = self.context(x)
        return self.head(torch.cat([x, c], dim=-1))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
