"""The step logs the gradient of an activation, which is a non-leaf."""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP314"], "culprits": [], "severity": "warning", "line": 25}


def build_model():
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))


def make_inputs():
    return torch.randn(3, 4)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    hidden = model[1](model[0](batch))
    loss = model[2](hidden).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    print("activation grad:", hidden.grad)
    optimizer.step()
    return loss.item()
