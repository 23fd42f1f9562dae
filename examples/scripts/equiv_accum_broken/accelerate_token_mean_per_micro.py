"""accelerate's gradient accumulation over micro-batches of padded token sequences, each micro-batch's loss a mean over
its own real tokens (cross_entropy with ignore_index, reduction "mean"). accelerator.backward() divides each by the
4 accumulation steps, so every micro-batch weighs the same, whatever its number of tokens: a token of a short
micro-batch counts more than one of a long one, and the accumulated gradient is not the gradient of the token mean over
the whole accumulated batch (what one batch of the same sequences gives). Nothing raises. Written from
https://github.com/huggingface/accelerate/pull/3193 ("how to handle gradient accumulation with cross-entropy") and
the Trainer's fix of the same issue, https://github.com/huggingface/transformers/pull/34191.

    python accelerate_token_mean_per_micro.py --steps 100
    gradprobe check_equivalence --script accelerate_token_mean_per_micro.py -- --steps 4
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "codes": ["GP802"], "culprits": ["0.weight", "2.bias"], "line": 47,
          "args": ["--steps=4"]}
ACCUM, VOCAB, LENGTH, PAD = 4, 20, 10, -100

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
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
for tokens, labels in itertools.islice(loader, args.steps * ACCUM):
    with accelerator.accumulate(model):
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=PAD)  # this micro-batch's tokens
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
