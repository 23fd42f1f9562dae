"""Transfer learning with the new head frozen by the freezing loop: the pretrained backbone is loaded, the new
classifier is attached, and only then is everything frozen but the last stage, so the new (random) classifier is
frozen too. The last stage trains, the loss moves, and the classifier keeps its random initialisation: GP123 (error)
at the freezing line.

Public reports of the same order: https://discuss.pytorch.org/t/how-to-freeze-the-part-of-the-model/31409 (freezing
every parameter after replacing `fc`, then asking why the new layer does not learn), and
https://github.com/pytorch/vision/issues/2174 (fine-tuning with `requires_grad = False` set after the head is replaced).
"""
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP123"], "culprits": ["fc.weight"], "line": 45, "severity": "error"}


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
    model.fc = nn.Linear(16, 4)  # the new task's classifier
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("stage2")
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
