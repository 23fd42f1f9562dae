"""Healthy twin of gp318_dead_relu_negative_bias.py: the same regression MLP with its hidden bias initialised at a small
positive value. About half of the hidden pre-activations are below 0 on a batch and some units are dead on every sample
of it: a sparse ReLU, as it should be. Every parameter gets a gradient (the dead units' rows are zero, not the layer),
and GP318 says nothing.

Written from the same public thread: facebookresearch/dlrm pull #358 (https://github.com/facebookresearch/dlrm/pull/358),
whose fix initialises the biases as Xavier/Glorot recommend.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP318", "GP306"]}


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(10, 32)
        self.out = nn.Linear(32, 1)
        nn.init.kaiming_uniform_(self.hidden.weight, nonlinearity="relu")
        nn.init.constant_(self.hidden.bias, 0.01)

    def forward(self, x, y=None):
        return self.out(F.relu(self.hidden(x)))


def build_model():
    return Regressor()


def make_inputs():
    return torch.randn(16, 10), torch.randn(16, 1)


def loss_fn(out, batch):
    return F.mse_loss(out, batch[1])
