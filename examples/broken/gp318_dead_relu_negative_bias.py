"""A regression MLP whose hidden layer's bias is initialised to a large negative constant: every pre-activation of the
batch is below 0, the ReLU is dead on all of it, and the hidden layer (and the output weight that reads the all-zero
activations) gets an exactly-zero gradient at every step. GP318 (`dead_relu`) names the ReLU, the measured share of
its inputs in the dead region (all of them), and the line that set the bias.

Written from public threads: facebookresearch/dlrm pull #358 (https://github.com/facebookresearch/dlrm/pull/358: "the
bias may be initialized to a large negative value, leading to a negative input to Relu. This prevents any training, as
all derivatives are zero") and jvargasmu/population_estimation issue #68
(https://github.com/jvargasmu/population_estimation/issues/68: "the initial solution predicts only zeros (due to RELU
activation). And hence, no gradients emerge").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP318"], "culprits": ["hidden.weight", "hidden.bias", "out.weight"],
          "severity": "warning", "line": 27}


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(10, 32)
        self.out = nn.Linear(32, 1)
        nn.init.kaiming_uniform_(self.hidden.weight, nonlinearity="relu")
        # meant: a small positive bias, to keep the units alive
        nn.init.constant_(self.hidden.bias, -20.0)

    def forward(self, x, y=None):
        return self.out(F.relu(self.hidden(x)))


def build_model():
    return Regressor()


def make_inputs():
    return torch.randn(16, 10), torch.randn(16, 1)


def loss_fn(out, batch):
    return F.mse_loss(out, batch[1])
