"""The healthy twin of gp201_several_models_regressor_left_out: build_model() returns the student, the regressor and
the teacher as a dict, and make_optimizer gives the student and the regressor to one optimizer in two parameter groups.
The teacher, in no optimizer and used under no_grad only, is frozen by design: no finding about it.

Written from pytorch/tutorials pull request #2514 (https://github.com/pytorch/tutorials/pull/2514, the knowledge
distillation tutorial: the teacher's outputs under torch.no_grad(), a trainable regressor between the student and
the teacher).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP201"], "options": {"steps": 3}}


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
    return torch.optim.SGD([{"params": models["student"].parameters()},
                            {"params": models["regressor"].parameters(), "lr": 0.05}], lr=0.1)


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
