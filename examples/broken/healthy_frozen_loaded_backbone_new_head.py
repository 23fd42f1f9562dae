"""Healthy twin of gp123_new_head_frozen_by_freeze_loop.py: the pretrained backbone (loaded from a checkpoint) is
frozen first, then the new classifier is attached, so it is trainable. The frozen modules were loaded, not left at
their initialisation: no GP123, no warning.

Written after https://discuss.pytorch.org/t/how-to-freeze-the-part-of-the-model/31409 (freeze, then replace the head).
"""
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "healthy": True, "absent": ["GP123"]}


class Backbone(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, d, 3, padding=1), nn.ReLU())
        self.stage1 = nn.Sequential(nn.Conv2d(d, d, 3, padding=1), nn.ReLU())
        self.stage2 = nn.Sequential(nn.Conv2d(d, d, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(d, 10)

    def forward(self, x):
        return self.fc(self.stage2(self.stage1(self.stem(x))).mean((2, 3)))


def pretrained_weights():
    """A tiny stand-in for an ImageNet checkpoint, saved in a temporary folder (no download)."""
    path = os.path.join(tempfile.mkdtemp(), "backbone.pt")
    torch.manual_seed(3)
    torch.save(Backbone().state_dict(), path)
    return torch.load(path)


def build_model():
    model = Backbone()
    model.load_state_dict(pretrained_weights())
    for p in model.parameters():
        p.requires_grad = False
    model.fc = nn.Linear(16, 4)  # the new task's classifier, trainable
    return model


def make_inputs():
    return torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3])


def train_step(model, batch, optimizer):
    x, y = batch
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def make_optimizer(model):
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
