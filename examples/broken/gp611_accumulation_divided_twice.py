"""Gradient accumulation over 4 micro-batches whose loss is divided by 4 twice: the loss function already returns
`loss / ACCUM` and the step divides again, so the accumulated gradient is 1/4 of the full batch's.

Public report: https://github.com/llm-random/llm-random/pull/529 ("losses are already divided by grad accumulation
steps"), the second division removed; see also https://github.com/huggingface/transformers/pull/35207.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": ["GP611"], "culprits": [], "line": 45, "options": {"steps": 2}}
ACCUM = 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def build_model():
    return Net()


def make_inputs():
    return {"x": torch.randn(16, 6), "y": torch.randint(0, 3, (16,))}


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss_fn(out, batch):
    return F.cross_entropy(out, batch["y"])


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    for x, y in zip(batch["x"].chunk(ACCUM), batch["y"].chunk(ACCUM), strict=True):
        loss = F.cross_entropy(model(x), y) / ACCUM  # scaled for accumulation here ...
        (loss / ACCUM).backward()  # ... and again here
    optimizer.step()
