"""A healthy twin of gp701_compile_only_branch.py: the branch on torch.compiler.is_compiling() holds the logging
only (a Python float, no gradient), and the temperature is applied on both paths, so the compiled module gives
every parameter the gradient eager gives it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP701"]}


class Classifier(nn.Module):
    def __init__(self, d=16, h=32, classes=4):
        super().__init__()
        self.encoder = nn.Linear(d, h)
        self.head = nn.Linear(h, classes)
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        logits = self.head(F.gelu(self.encoder(x)))
        if not torch.compiler.is_compiling():  # logging on the eager path only: no gradient flows through it
            self.last_logit_norm = float(logits.detach().norm())
        return logits / self.temperature


def build_model():
    return torch.compile(Classifier(), backend="aot_eager")


def make_inputs():
    return {"x": torch.randn(8, 16), "labels": torch.randint(0, 4, (8,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
