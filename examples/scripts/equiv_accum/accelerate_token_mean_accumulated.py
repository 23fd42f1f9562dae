"""Healthy twin of equiv_accum_broken/accelerate_token_mean_per_micro.py: the loop takes the --accum micro-batches of
a step first, counts their real tokens together, and divides each micro-batch's token sum by that count times
--accum (accelerator.backward() divides by --accum again), so the micro-batches' losses add up to the token mean over
the whole accumulated batch, as accelerate's guide shows (https://github.com/huggingface/accelerate/pull/3193). The
script groups its batches itself, so the reference is named with its own argument: `--accum 1`.

    python accelerate_token_mean_accumulated.py --steps 100 --accum 4
    gradprobe check_equivalence --script accelerate_token_mean_accumulated.py --reference-args="--accum 1" -- --steps 4
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "codes": [], "healthy": True, "absent": ["GP802"], "args": ["--steps=4"],
          "options": {"reference": {"args": ["--accum", "1"]}}}
VOCAB, LENGTH, PAD = 20, 10, -100

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--accum", type=int, default=4)
args = parser.parse_args()
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
torch.manual_seed(0)


def sequences(n=128):
    tokens = torch.randint(0, VOCAB, (n, LENGTH))
    lengths = torch.randint(2, LENGTH + 1, (n,))
    labels = torch.where(torch.arange(LENGTH) < lengths[:, None], tokens.roll(-1, dims=1), torch.tensor(PAD))
    return TensorDataset(tokens, labels)


model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Tanh(), nn.Linear(16, VOCAB))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
loader = DataLoader(sequences(), batch_size=2, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
batches = iter(loader)
for _ in range(args.steps):
    micro = list(itertools.islice(batches, args.accum))
    n_tokens = sum(int((labels != PAD).sum()) for _, labels in micro)  # the whole accumulated batch's tokens
    for tokens, labels in micro:
        with accelerator.accumulate(model):
            logits = model(tokens)
            token_sum = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=PAD, reduction="sum")
            accelerator.backward(token_sum / n_tokens * args.accum)
            optimizer.step()
            optimizer.zero_grad()
