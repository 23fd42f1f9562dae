"""The healthy twin of gp610_accuracy_check_leaves_eval_mode: the accuracy check sets the model back to train mode.

Public report: https://github.com/facebookresearch/clevr-iep/pull/22 ("check_accuracy ... is called periodically during
training ... set_mode('eval') is called ... it seems to forget setting model back to train mode"); the same in
https://github.com/fartashf/vsepp/issues/4 (validation "will not call model.train_start() until next epoch").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 3}, "absent": ["GP610"]}
_STEP = [0]


def build_model():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))


def make_inputs():
    return torch.randn(16, 8), torch.randint(0, 3, (16,))


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05)


def check_accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy


def train_step(model, batch, optimizer):
    x, y = batch
    if _STEP[0] % 100 == 0:  # monitor the accuracy every 100 steps (here: at the first)
        check_accuracy(model, x, y)
    _STEP[0] += 1
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
