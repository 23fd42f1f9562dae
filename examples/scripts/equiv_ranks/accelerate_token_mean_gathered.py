"""Healthy twin of equiv_ranks_broken/accelerate_token_mean_per_process.py: each process sums its token losses and
divides by the number of real tokens of the global batch, gathered across processes (accelerator.gather), times the
number of processes, which DDP's average divides back out: every token weighs the same as in one process on the
global batch, as accelerate's guide does it (https://github.com/huggingface/accelerate/pull/3193) after
https://github.com/huggingface/transformers/issues/34242.

    accelerate launch --num_processes 2 accelerate_token_mean_gathered.py --steps 100
    gradprobe check_equivalence --script accelerate_token_mean_gathered.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "absent": ["GP801"],
          "args": ["--steps=4"]}
VOCAB, LENGTH, PAD = 20, 10, -100

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
tokens = torch.randint(0, VOCAB, (64, LENGTH))
lengths = torch.randint(2, LENGTH + 1, (64,))
labels = torch.where(torch.arange(LENGTH) < lengths[:, None], tokens.roll(-1, dims=1), torch.tensor(PAD))
loader = DataLoader(TensorDataset(tokens, labels), batch_size=4, shuffle=True)
model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Tanh(), nn.Linear(16, VOCAB))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for ids, targets in itertools.islice(loader, args.steps):
    logits = model(ids)
    n_tokens = accelerator.gather((targets != PAD).sum()).sum()  # the global batch's real tokens
    token_sum = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=PAD, reduction="sum")
    loss = token_sum * accelerator.num_processes / n_tokens
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
