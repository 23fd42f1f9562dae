"""Healthy twin of gp319_freeze_pattern_overmatch.py: the encoder's blocks are frozen by their full name prefix
(`name.startswith("encoder.layer.")`), so the final layer norm and the classifier head stay trainable. GP105 says what
is frozen (info); no GP319.

Written from google-research/adapter-bert issue #8 (freeze the blocks, keep the layer norms and the head trainable).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP105"], "culprits": ["encoder.layer.0.weight"], "severity": "info",
          "healthy": True, "absent": ["GP319"]}


class Encoder(nn.Module):
    def __init__(self, dim=8, depth=3):
        super().__init__()
        self.embed = nn.Linear(4, dim)
        self.layer = nn.ModuleList([nn.Linear(dim, dim) for _ in range(depth)])
        self.layernorm = nn.LayerNorm(dim)

    def forward(self, x):
        h = self.embed(x)
        for blk in self.layer:
            h = torch.relu(blk(h))
        return self.layernorm(h)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.out_layer = nn.Linear(8, 2)

    def forward(self, x):
        return self.out_layer(self.encoder(x))


def build_model():
    model = Classifier()
    for name, p in model.named_parameters():
        if name.startswith("encoder.layer."):
            p.requires_grad = False
    return model


def make_inputs():
    return torch.randn(4, 4)
