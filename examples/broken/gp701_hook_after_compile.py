"""A gate applied by a forward hook registered after the compiled model's first call: the compiled graph was traced
without it, so the gate parameter gets no gradient (and every other gradient differs) under torch.compile, while the
eager model, the one you read, trains it.

After pytorch/pytorch#117758 ("torch.compile ignores forward hooks after compilation is triggered"): dynamo does not
guard on a module's hook dicts by default (torch._dynamo.config.skip_nnmodule_hook_guards), so a hook added after the
first compiled call never runs in the compiled graph (likewise backward hooks, #115750).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP701"], "culprits": ["encoder.gate"], "line": 37}


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
        self.head = nn.Linear(h, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def _gate(module, inputs, output):
    return output * torch.sigmoid(module.gate)


def build_model():
    net = Classifier()
    model = torch.compile(net, backend="aot_eager")
    model(torch.randn(8, 16))  # a smoke test on one batch: the graph is traced here, without the hook below
    net.encoder.register_forward_hook(_gate)  # BUG: registered after the first compiled call
    return model


def make_inputs():
    return {"x": torch.randn(8, 16), "labels": torch.randint(0, 4, (8,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
