"""A healthy control: a small CNN classifier (conv, batch norm, pooling, dropout) with cross-entropy and AdamW."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(16, classes)

    def forward(self, images):
        return self.classifier(self.dropout(self.features(images).flatten(1)))


def build_model():
    return SmallCNN()


def make_inputs():
    return {"images": torch.randn(4, 3, 16, 16), "labels": torch.randint(0, 10, (4,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
