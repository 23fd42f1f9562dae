"""An in-place update of a tensor that sigmoid saved for backward."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP308"], "culprits": [], "line": 15}


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        g = torch.sigmoid(self.fc(x))
        g.mul_(2.0)
        return g


def build_model():
    return Gate()


def make_inputs():
    return torch.randn(3, 4)
