"""Hard codebook assignment with argmax: the encoder gets no gradient."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP305"], "culprits": ["encoder.weight", "encoder.bias"], "line": 15}


class HardVQ(nn.Module):
    def __init__(self, d=8, k=16):
        super().__init__()
        self.encoder = nn.Linear(d, k)
        self.codebook = nn.Embedding(k, d)

    def forward(self, x):
        codes = self.encoder(x).argmax(dim=-1)
        return self.codebook(codes)


def build_model():
    return HardVQ()


def make_inputs():
    return torch.randn(4, 8)
