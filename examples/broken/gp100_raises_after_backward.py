"""A train_step whose logging after backward() raises (a metrics dict without the key it appends to): the step's
gradients were traced, and the error is reported at its own line instead of being dropped as before."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP100"], "culprits": [], "line": 24}

history = {"train_loss": []}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def make_inputs():
    return torch.randn(5, 4)


def train_step(model, batch, optimizer):
    loss = model(batch).pow(2).mean()
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    history["loss"].append(loss.item())  # KeyError: the dict's key is "train_loss"
    return loss
