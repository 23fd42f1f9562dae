"""Gradient accumulation with a token-mean loss: each micro-batch sums its token losses and divides by the number of
tokens in the whole batch (micro-batches hold different numbers of tokens). The constant factor on each loss is
1/tokens, far from 1/4, yet the accumulated gradient equals the full-batch one: the full-batch ratio (1.00x), not the
factor, is what tells it from a loss divided twice.

Public report: https://github.com/huggingface/transformers/pull/35207 (the loss normalised by the number of items in
the whole accumulated batch).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 2},
          "absent": ["GP601", "GP602", "GP605", "GP606", "GP611"]}
ACCUM = 4


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))


def build_model():
    return Tagger()


def make_inputs():
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(10)[None, :] < torch.tensor([10, 3, 7, 2, 9, 5, 4, 8])[:, None]
    return {"tokens": torch.randint(0, 20, (8, 10), generator=g), "labels": torch.randint(0, 20, (8, 10), generator=g),
            "mask": mask}


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def _summed(logits, labels, mask):
    return (F.cross_entropy(logits.transpose(1, 2), labels, reduction="none") * mask).sum()


def loss_fn(out, batch):
    return _summed(out, batch["labels"], batch["mask"]) / batch["mask"].sum()


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    tokens = batch["mask"].sum()
    for t, y, m in zip(*(batch[k].chunk(ACCUM) for k in ("tokens", "labels", "mask")), strict=True):
        loss = _summed(model(t), y, m) / tokens
        loss.backward()
    optimizer.step()
