"""The optimizer is built lazily once, on the first step, and reused."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}
_STATE = {}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def make_inputs():
    return {"x": torch.randn(6, 4), "y": torch.randint(0, 2, (6,))}


def train_step(model, batch, optimizer):
    if "opt" not in _STATE:
        _STATE["opt"] = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt = _STATE["opt"]
    opt.zero_grad()
    F.cross_entropy(model(batch["x"]), batch["y"]).backward()
    opt.step()
