"""A tiny language model trained in a plain loop whose output head is "tied" to the embedding with `.data`:
`nn.Parameter(self.embed.weight.data)` is a second Parameter over the embedding's storage. AdamW holds both, so each
step applies two updates (two moment states) to one matrix, each from part of its gradient. diagnose finds it by
storage identity at the tie's line and measures the step against one tied Parameter (GP805).

After pytorch/xla#2719 (a tie made with `.data`; "If you set the `.weight` instead of `.weight.data`, the behavior is
consistent with the docs"). The healthy twin is ../shared_storage/train.py.

    python train.py --steps 50
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
args = parser.parse_args()
torch.manual_seed(0)


class TinyLM(nn.Module):
    def __init__(self, vocab=40, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = nn.Parameter(self.embed.weight.data)

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(args.steps):
    ids = torch.randint(0, 40, (8, 12))
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 40), ids[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
