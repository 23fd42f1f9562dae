"""A "monitor" that snapshots the hidden state through torch.save/torch.load in memory, on the training path."""
import io

import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP309"], "culprits": ["encoder.weight"], "line": 24}


class Posterior(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.encoder = nn.Linear(d, d)
        self.head = nn.Linear(d, 1)

    def snapshot(self, h):
        buf = io.BytesIO()
        torch.save(h, buf)
        buf.seek(0)
        return buf

    def forward(self, x):
        h = torch.tanh(self.encoder(x))
        h = torch.load(self.snapshot(h))
        return self.head(h)


def build_model():
    return Posterior()


def make_inputs():
    return torch.randn(4, 6)
