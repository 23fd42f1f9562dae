"""Attention pooling whose weights are computed on .data, so the scorer never learns."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP302"], "culprits": ["score.weight", "score.bias"], "line": 15}


class AttnPool(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.score = nn.Linear(d, 1)
        self.out = nn.Linear(d, 2)

    def forward(self, h):
        w = torch.softmax(self.score(h).data, dim=1)
        return self.out((w * h).sum(1))


def build_model():
    return AttnPool()


def make_inputs():
    return torch.randn(2, 5, 8)
