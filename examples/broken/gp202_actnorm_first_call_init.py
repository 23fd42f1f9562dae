"""ActNorm with data-dependent init that swaps in new Parameters on its first call (after the optimizer exists)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP202"], "culprits": ["norm.log_scale"], "line": 21}


class ActNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(d))
        self.shift = nn.Parameter(torch.zeros(d))
        self.initialized = False

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                mean = x.mean(0)
                std = x.std(0) + 1e-6
            # new Parameter objects: the optimizer still holds the old ones
            self.log_scale = nn.Parameter(-torch.log(std))
            self.shift = nn.Parameter(-mean)
            self.initialized = True
        return (x + self.shift) * torch.exp(self.log_scale)


class Flow(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.norm = ActNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        return self.head(self.norm(x))


def build_model():
    return Flow()


def make_inputs():
    return torch.randn(16, 8)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def loss_fn(out, batch):
    return out.pow(2).mean()
