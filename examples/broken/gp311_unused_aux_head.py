"""An auxiliary head defined but never called in forward."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP311"], "culprits": ["aux.weight"], "severity": "warning"}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.aux = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
