"""build_model() returning several models (a dict of modules): a student, a FitNets regressor that maps its hidden
features to the teacher's, and the teacher, used under no_grad as the target. make_optimizer builds the optimizer from
the student's parameters only, so the regressor gets a gradient at every step and never moves. The finding names it
by the dict's key: `regressor.weight`.

Written from AberHu/Knowledge-Distillation-Zoo issue #7 (https://github.com/AberHu/Knowledge-Distillation-Zoo/issues/7,
"Question on FitNet (Hint)": the hint module between student and teacher is a module of its own and learns only if an
optimizer holds it).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP201"], "culprits": ["regressor.weight", "regressor.bias"], "line": 38,
          "options": {"steps": 3}}


class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 5)

    def forward(self, x):
        features = self.body(x)
        return features, self.head(features)


def build_model():
    return {"student": Net(8), "regressor": nn.Linear(8, 32), "teacher": Net(32).eval()}


def make_inputs():
    return torch.randn(16, 12), torch.randint(0, 5, (16,))


def make_optimizer(models):
    return torch.optim.SGD(models["student"].parameters(), lr=0.1)


def train_step(models, batch, optimizer):
    x, y = batch
    with torch.no_grad():
        teacher_features, teacher_logits = models["teacher"](x)
    features, logits = models["student"](x)
    hint = F.mse_loss(models["regressor"](features), teacher_features)
    loss = F.cross_entropy(logits, y) + F.mse_loss(logits, teacher_logits) + hint
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
