"""Freezing the encoder's blocks by a name test, `if "layer" in name`, that also matches `layernorm` and the classifier
`out_layer`: the final layer norm and the head are frozen with the blocks and never learn. GP319 names the rule's
line, its pattern, and the counts: 6 tensors it names as a whole component (`encoder.layer.N`), 4 it matched only
inside a longer name.

Written from google-research/adapter-bert issue #8 ("freezing layer_norm and head": the layer norms and the head must
stay trainable when the rest is frozen by name) and Megvii-BaseDetection/YOLOX issue #121 (freezing some layers by
hand "and consider batchnorm").
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP319"], "severity": "warning", "line": 44,
          "culprits": ["encoder.layernorm.weight", "encoder.layernorm.bias", "out_layer.weight", "out_layer.bias"]}


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
        if "layer" in name:  # meant: the encoder's blocks
            p.requires_grad = False
    return model


def make_inputs():
    return torch.randn(4, 4)
