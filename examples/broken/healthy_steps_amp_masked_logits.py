"""Mixed precision with a masked class done right: the mask is applied to the logits before log_softmax and masked
labels are ignored, so the loss is finite and the GradScaler steps (the healthy twin of gp617_scaler_skips_every_step.py;
https://github.com/deepinsight/insightface/issues/2262)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3},
          "absent": ["GP615", "GP617", "GP606"]}
SCALER = torch.amp.GradScaler("cpu", init_scale=1024.0)
MASK = torch.tensor([0.0, 0.0, float("-inf")])


def build_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_inputs():
    return {"x": torch.randn(8, 6), "y": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    logp = (model(batch["x"]) + MASK).log_softmax(-1)
    y = batch["y"].masked_fill(batch["y"] == 2, -100)
    loss = F.nll_loss(logp, y, ignore_index=-100)
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
