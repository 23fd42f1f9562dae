"""The healthy twin of ../shared_storage_broken/train.py: the output head tied to the embedding as transformers'
tie_weights() does, `self.head.weight = self.embed.weight` (one Parameter under two names, GP108 info), so AdamW
updates the matrix once with the summed gradient: no GP805.

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
        self.head.weight = self.embed.weight

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
