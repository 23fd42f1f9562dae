"""A norm computed with sqrt of a sum that is exactly zero on padded rows."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP307"], "culprits": ["fc.weight"], "line": 15}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)

    def forward(self, x):
        h = self.fc(x)
        return (h * h).sum(-1).sqrt()


def build_model():
    return Net()


def make_inputs():
    x = torch.randn(3, 4)
    x[0] = 0.0  # a padded row
    return x
