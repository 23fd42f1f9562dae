"""The healthy twin of gp616_aux_term_head_not_in_optimizer.py: the auxiliary head on detached features is in the
optimizer, so both terms go down on one fixed batch."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 2, "overfit_steps": 12},
          "absent": ["GP616"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux = nn.Linear(32, 1)


def build_model():
    return Net()


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(16, 6, generator=g), "y": torch.randint(0, 3, (16,), generator=g),
            "side": torch.randn(16, 1, generator=g)}


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    feats = model.body(batch["x"])
    ce = F.cross_entropy(model.head(feats), batch["y"])
    side = F.mse_loss(model.aux(feats.detach()), batch["side"])
    loss = ce + 0.5 * side
    loss.backward()
    optimizer.step()
    return loss
