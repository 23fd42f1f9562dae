"""A healthy twin of gp701_hook_after_compile.py: the gate hook is registered before the first compiled call, so the
compiled graph applies it and every parameter, the gate included, gets the gradient eager gives it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP701"]}


class Encoder(nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.proj = nn.Linear(d, h)
        self.gate = nn.Parameter(torch.full((h,), 0.5))

    def forward(self, x):
        return F.gelu(self.proj(x))


class Classifier(nn.Module):
    def __init__(self, d=16, h=32, classes=4):
        super().__init__()
        self.encoder = Encoder(d, h)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(h, classes)

    def forward(self, x):
        return self.head(self.dropout(self.encoder(x)))


def _gate(module, inputs, output):
    return output * torch.sigmoid(module.gate)


def build_model():
    net = Classifier()
    net.encoder.register_forward_hook(_gate)  # before compiling: the traced graph applies the gate
    model = torch.compile(net, backend="aot_eager")
    model(torch.randn(8, 16))  # a smoke test on one batch
    return model


def make_inputs():
    return {"x": torch.randn(8, 16), "labels": torch.randint(0, 4, (8,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
