"""Random Fourier features by design: a frozen, randomly initialised projection (never loaded, never trained) feeds a
trainable classifier. The projection is on the path to the loss and at its initialisation, but nothing in the model
was loaded and a trainable module learns from its output: GP123 says so as info (a fixed random projection), never a
warning or an error.

Written after random Fourier features as public PyTorch code builds them: a fixed Gaussian projection frozen at its
random draw (https://github.com/jmclong/random-fourier-features-pytorch/pull/7, "creating parameter with no grad for
b"; the `GaussianFourierProjection` quoted in https://github.com/Yanghao-Wang/RandBox/issues/10: "These weights are
fixed during optimization and are not trainable").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP123"], "culprits": ["features.weight"], "severity": "info", "healthy": True}


class RandomFeatures(nn.Module):
    def __init__(self, d_in=4, n_features=32, classes=3):
        super().__init__()
        self.features = nn.Linear(d_in, n_features)
        nn.init.normal_(self.features.weight, std=2.0)
        self.features.requires_grad_(False)
        self.head = nn.Linear(2 * n_features, classes)

    def forward(self, x):
        z = self.features(x)
        return self.head(torch.cat([torch.sin(z), torch.cos(z)], -1))


def build_model():
    return RandomFeatures()


def make_inputs():
    return torch.randn(16, 4, generator=torch.Generator().manual_seed(0))


def loss_fn(logits, x):
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # three classes of the inputs' signs
    return F.cross_entropy(logits, labels)


def make_optimizer(model):
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
