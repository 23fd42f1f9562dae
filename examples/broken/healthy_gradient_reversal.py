"""Healthy: a domain-adversarial gradient-reversal layer (identity forward, backward = -alpha x the gradient)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "run_gradcheck", "codes": ["GP409"], "culprits": ["ReverseGrad"], "severity": "info", "healthy": True}


class ReverseGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class DANN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.label_head = nn.Linear(8, 3)
        self.domain_head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.features(x)
        return self.label_head(h), self.domain_head(ReverseGrad.apply(h, 0.3))


def build_model():
    return DANN()


def make_inputs():
    return {"x": torch.randn(5, 6), "y": torch.randint(0, 3, (5,)), "d": torch.randint(0, 2, (5,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model, batch, optimizer):
    label_logits, domain_logits = model(batch["x"])
    loss = F.cross_entropy(label_logits, batch["y"]) + F.cross_entropy(domain_logits, batch["d"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
