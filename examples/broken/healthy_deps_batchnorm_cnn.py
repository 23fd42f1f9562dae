"""Healthy: a small CNN with BatchNorm, in train mode. Each output depends on every image of the batch through the
batch statistics: by design, reported as info (GP904), never as examples that see each other."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_dependencies", "codes": ["GP904"], "culprits": ["bn"], "severity": "info", "healthy": True,
          "absent": ["GP902"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.head(h.mean(dim=(2, 3)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(4, 3, 8, 8), "y": torch.tensor([0, 1, 2, 3])}


def loss_fn(out, batch):
    return nn.functional.cross_entropy(out, batch["y"])
