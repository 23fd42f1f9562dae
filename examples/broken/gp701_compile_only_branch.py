"""A learned temperature applied on the eager path only: the forward branches on torch.compiler.is_compiling(), so
under torch.compile the temperature is never read and gets no gradient (and every other gradient differs), while
the eager model, the one you read and test, trains it.

After huggingface/transformers#48975 ("Fix mask creation not being skipped under `torch.compile`"): code that
branches on what torch.compiler reports (is_compiling(), is_exporting()) computes something else under
torch.compile than in eager, and the difference only shows in the compiled run's numbers (see also
pytorch/pytorch#144820, where the same branch returns x + 1 compiled and x - 1 in eager).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP701"], "culprits": ["temperature"], "line": 28}


class Classifier(nn.Module):
    def __init__(self, d=16, h=32, classes=4):
        super().__init__()
        self.encoder = nn.Linear(d, h)
        self.head = nn.Linear(h, classes)
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        logits = self.head(F.gelu(self.encoder(x)))
        if not torch.compiler.is_compiling():  # BUG: meant to skip a logging path, it also skips the temperature
            self.last_logit_norm = float(logits.detach().norm())
            logits = logits / self.temperature
        return logits


def build_model():
    return torch.compile(Classifier(), backend="aot_eager")


def make_inputs():
    return {"x": torch.randn(8, 16), "labels": torch.randint(0, 4, (8,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
