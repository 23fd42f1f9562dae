"""The lazily created head is added to the optimizer where it is created."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 3, (6,))}


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, batch, optimizer):
    if not hasattr(model, "head"):
        model.head = nn.Linear(8, 3)
        optimizer.add_param_group({"params": model.head.parameters()})
    optimizer.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    optimizer.step()
