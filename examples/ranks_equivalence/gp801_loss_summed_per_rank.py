"""A build_model() target whose loss is summed over the batch, checked at world size 2: gradprobe runs the target on
2 ranks (the process group initialised, the model wrapped in DistributedDataParallel, each rank a batch of its own,
as scriptmode/modelranks.py does for the other tools) and as one process fed the two ranks' inputs joined, from the
same weights. DDP averages the ranks' gradients, so a summed loss gives each example 1/N of its one-process weight:
the gradient is half the one-process gradient on the same global batch. From
https://github.com/pytorch/pytorch/issues/37359 ("if the loss function is MSE in sum mode, the gradient reduction
should use sum instead of mean").

    gradprobe check_equivalence examples/ranks_equivalence/gp801_loss_summed_per_rank.py --world-size 2
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["body.0.weight"],
          "ratio_is": "1/N", "line": 38}


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
    return F.cross_entropy(out, batch["y"], reduction="sum")


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
