"""A token-level model trained with accelerate across processes (as `accelerate launch` starts them: the Accelerator
reads torchrun's environment and wraps the model in DDP) whose loss is each process's token mean: cross_entropy with
ignore_index over that process's own real tokens. DDP averages the processes' gradients, so a token of a process
holding few real tokens weighs more than one of a process holding many, and the gradient is not the token mean over
the global batch, what one process computes on it. Written from
https://github.com/huggingface/transformers/issues/34242 (token averaging across DDP processes) and accelerate's
guide for it (https://github.com/huggingface/accelerate/pull/3193: gather the number of items across processes).

    accelerate launch --num_processes 2 accelerate_token_mean_per_process.py --steps 100
    gradprobe check_equivalence --script accelerate_token_mean_per_process.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["0.weight", "2.bias"],
          "line": 40, "args": ["--steps=4"]}
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
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=PAD)  # this process's tokens
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
