"""An adapter attached in make_optimizer, after the optimizer was built from model.parameters(): it is in no
param group. The line to move is the attachment (later in the same function), not the optimizer."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP201"], "culprits": ["adapter.weight", "adapter.bias"],
          "line": 34}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.adapter = None
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.body(x))
        if self.adapter is not None:
            h = h + self.adapter(h)
        return self.head(h)


def build_model():
    return Net()


def make_inputs():
    return torch.randn(4, 8)


def make_optimizer(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.adapter = nn.Linear(8, 8)
    return optimizer
