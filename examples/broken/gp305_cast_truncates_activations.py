"""An integer cast in the middle of an MLP: everything before it gets no gradient, and the layer after it reads
only zeros (sigmoid outputs truncate to 0), so its weight gets an exactly-zero gradient: one cause, one finding."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP305"], "culprits": ["fc1.weight", "fc1.bias", "fc2.weight"], "line": 17}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        h = h.long().float()
        return self.fc2(h)


def build_model():
    torch.manual_seed(0)
    return MLP()


def make_inputs():
    return {"x": torch.randn(8, 10)}


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
