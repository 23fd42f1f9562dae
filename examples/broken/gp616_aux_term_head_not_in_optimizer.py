"""One term of the loss cannot go down on one fixed batch while the total does: an auxiliary head trained on detached
features (a probe that must not shape the backbone) adds its loss to the classification loss, but the optimizer was
built over the backbone and the main head only, so the auxiliary head never moves and its term does not go down (it drifts
with the features it reads). The total still falls (the classification term does), so a loss curve alone hides it.

Public report: https://github.com/lucidrains/compressive-transformer-pytorch/issues/5 ("aux_loss does not update any
weight": an auxiliary loss added to training that trains nothing).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP616"], "culprits": ["aux.weight", "aux.bias"], "line": 43,
          "options": {"steps": 2, "overfit_steps": 12}}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux = nn.Linear(32, 1)  # predicts a side target from the (detached) features


def build_model():
    return Net()


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(16, 6, generator=g), "y": torch.randint(0, 3, (16,), generator=g),
            "side": torch.randn(16, 1, generator=g)}


def make_optimizer(model):
    return torch.optim.Adam(list(model.body.parameters()) + list(model.head.parameters()), lr=1e-2)  # BUG: no aux


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    feats = model.body(batch["x"])
    ce = F.cross_entropy(model.head(feats), batch["y"])
    side = F.mse_loss(model.aux(feats.detach()), batch["side"])
    loss = ce + 0.5 * side
    loss.backward()
    optimizer.step()
    return loss
