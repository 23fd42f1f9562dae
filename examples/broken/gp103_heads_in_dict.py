"""Per-language heads kept in a plain dict instead of nn.ModuleDict."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP103"], "culprits": ["heads.en.weight", "heads.de.weight"], "line": 12}


class Tagger(nn.Module):
    def __init__(self, d=8, tags=4):
        super().__init__()
        self.encoder = nn.Linear(d, d)
        self.heads = {"en": nn.Linear(d, tags), "de": nn.Linear(d, tags)}

    def forward(self, x):
        h = self.encoder(x)
        return self.heads["en"](h) + self.heads["de"](h)


def build_model():
    return Tagger()


def make_inputs():
    return torch.randn(3, 8)
