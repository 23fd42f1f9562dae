"""Activations round-tripped through Python lists for a "safe" clamp."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP304"], "culprits": ["inp.weight", "inp.bias"], "line": 16}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        h = self.inp(x)
        rows = [[min(max(v, -3.0), 3.0) for v in row] for row in h.tolist()]
        h = torch.tensor(rows)
        return self.out(h)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(3, 4)
