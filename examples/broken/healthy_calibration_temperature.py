"""A classifier with a calibration temperature used only in eval, deliberately kept out of the optimizer."""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True}


class Classifier(nn.Module):
    def __init__(self, d=16, k=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, k))
        self.temperature = nn.Parameter(torch.ones(1))  # fitted after training, on held-out data

    def forward(self, x):
        logits = self.body(x)
        if not self.training:
            logits = logits / self.temperature
        return logits


def build_model():
    return Classifier()


def make_inputs():
    return torch.randn(8, 16), torch.randint(0, 4, (8,))


def make_optimizer(model):
    return torch.optim.SGD([p for n, p in model.named_parameters() if n != "temperature"], lr=0.1)


def train_step(model, batch, optimizer):
    x, y = batch
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss
