"""Mixed precision: the loss is inf at every step (a log of a probability that is exactly 0 for a masked class), so the
GradScaler finds inf/nan gradients and skips every optimizer step; the scale halves each time and nothing trains.

Public report: https://github.com/deepinsight/insightface/issues/2262 ("Why Fp16 Grad Scale is 0?": "Loss nan ... Fp16
Grad Scale: 0" at every logged step).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP617"], "culprits": [], "line": 32, "options": {"steps": 3}}
SCALER = torch.amp.GradScaler("cpu", init_scale=1024.0)
MASK = torch.tensor([1.0, 1.0, 0.0])  # class 2 is masked out, but some labels are 2


def build_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_inputs():
    return {"x": torch.randn(8, 6), "y": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    probs = model(batch["x"]).softmax(-1) * MASK
    loss = F.nll_loss(probs.log(), batch["y"])  # log(0) = -inf for the masked class
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
