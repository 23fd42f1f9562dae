"""Healthy gradient accumulation with a token-mean loss: the 4 micro-batches hold different numbers of real tokens
(padding is ignored), each micro-batch sums its token losses and divides by the number of real tokens in the whole
accumulated batch. The constant factor on each loss is 1/tokens, far from 1/4, yet the 4 losses add up to one mean over
the batch's tokens: healthy.

Written from the public report https://github.com/huggingface/transformers/pull/35207 (the loss normalised by the
number of items in the whole accumulated batch, `num_items_in_batch`).
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
torch.manual_seed(0)
ACCUM, PAD = 4, -100

model = nn.Sequential(nn.Embedding(20, 16), nn.Tanh(), nn.Linear(16, 20))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def micro_batches():
    out = []
    for length in (3, 5, 7, 9):  # real tokens per sequence differ between micro-batches
        tokens = torch.randint(0, 20, (2, 10))
        labels = tokens.roll(-1, dims=1)
        labels[:, length:] = PAD
        out.append((tokens, labels))
    return out


for _step in range(args.steps):
    batch = micro_batches()
    n_tokens = sum(int((labels != PAD).sum()) for _, labels in batch)
    for tokens, labels in batch:
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, 20), labels.view(-1), ignore_index=PAD, reduction="sum") / n_tokens
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
