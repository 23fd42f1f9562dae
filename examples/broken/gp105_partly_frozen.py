"""Fine-tuning only the classifier of a small CNN (frozen features, on purpose)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP105"], "culprits": ["features.0.weight"], "severity": "info", "healthy": True}


def build_model():
    model = nn.Sequential()
    model.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model.classifier = nn.Linear(4, 2)
    model.features.requires_grad_(False)
    return model


def make_inputs():
    return torch.randn(2, 3, 8, 8)
