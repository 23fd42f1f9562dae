"""Healthy twin of gp801_loss_summed_per_rank.py: the same build_model() target with its loss averaged over the
batch, checked at world size 2 against one process on the two ranks' inputs joined: DDP's average of the ranks'
gradients is the one-process gradient on the same global batch, and check_equivalence says so with the largest
difference.

    gradprobe check_equivalence examples/ranks_equivalence/healthy_loss_mean_per_rank.py --world-size 2
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "absent": ["GP801"]}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x))


def build_model():
    return Classifier()


def make_inputs():
    return {"x": torch.randn(8, 6), "y": torch.randint(0, 3, (8,))}


def loss_fn(out, batch):
    return F.cross_entropy(out, batch["y"])


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
