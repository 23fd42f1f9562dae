"""A train_step accumulating 4 micro-batches whose losses are added without dividing by 4 (the build_model() form):
the optimizer step gets 4 times the gradient of the same batch as one batch. check_equivalence runs the user's
train_step and, from the same pre-step weights, the target's loss_fn on the whole batch, and compares the two
gradients tensor by tensor. Public report: https://github.com/karpathy/nanoGPT/issues/206 ("performs loss.backward()
without first normalizing the loss value to account for number of gradient accumulation steps").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "codes": ["GP802"], "culprits": ["body.0.weight", "head.bias"], "line": 45,
          "options": {"steps": 2}}
ACCUM = 4


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
    return {"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))}


def loss_fn(out, batch):
    return F.cross_entropy(out, batch["y"])


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    for x, y in zip(batch["x"].chunk(ACCUM), batch["y"].chunk(ACCUM), strict=True):
        F.cross_entropy(model(x), y).backward()  # no / ACCUM
    optimizer.step()
