"""The healthy twin of accelerate_accum_twice_broken: a token-mean loss under accelerate's gradient accumulation, as in
accelerate's own example for autoregressive models (https://github.com/huggingface/accelerate/issues/3661): each
micro-batch sums its token losses, divides by the real tokens of the whole accumulated batch and multiplies by the
accumulation steps, which `accelerator.backward()` divides by again. The 4 losses add up to one mean over the batch's
tokens: healthy, although the loss is divided by 4 (and by the token count) on its way to backward().

    accelerate launch train.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
ACCUM, PAD = 4, -100

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(20, 16), nn.Tanh(), nn.Linear(16, 20))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = accelerator.prepare(model, optimizer)


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
        with accelerator.accumulate(model):
            logits = model(tokens)
            loss = F.cross_entropy(logits.view(-1, 20), labels.view(-1), ignore_index=PAD, reduction="sum")
            accelerator.backward(loss / n_tokens * ACCUM)
            optimizer.step()
            optimizer.zero_grad()
