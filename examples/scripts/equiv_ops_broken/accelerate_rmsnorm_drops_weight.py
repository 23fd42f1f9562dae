"""A small MLP language model trained with accelerate (`accelerate launch --num_processes 2`, or torchrun) whose RMSNorm
is a custom autograd.Function whose backward forgets the norm weight's factor in the input's gradient: exact while the
weight is all ones (as initialised), wrong as soon as training moves it. check_equivalence's custom-op comparison runs
on the script's first step (as one process) and checks the Function at the recorded weights and at its weights
perturbed: GP401 at the backward's line. After https://github.com/karpathy/llm.c/pull/763 ("I forgot to multiply by
the weight in the backward pass"); the healthy twin is equiv_ops/accelerate_rmsnorm.py.

    accelerate launch --num_processes 2 accelerate_rmsnorm_drops_weight.py --steps 100
    gradprobe check_equivalence --script accelerate_rmsnorm_drops_weight.py --world-size 2 -- --steps=2
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP401"], "culprits": ["RMSNormFunction"], "line": 39,
          "args": ["--steps=2"], "verified": ["storage:"], "options": {"compare": ["custom_ops", "storage", "packing"]}}

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x * rstd
        grad_x = rstd * (grad_out - x_hat * (grad_out * x_hat).mean(dim=-1, keepdim=True))  # no `* weight`
        grad_weight = (grad_out * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight, self.eps)


class MLPLM(nn.Module):
    def __init__(self, vocab=40, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(h)))
        return self.head(self.norm(h))


torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
ids = torch.randint(0, 40, (64, 12), generator=torch.Generator().manual_seed(0))
loader = DataLoader(TensorDataset(ids), batch_size=4, shuffle=True)
model = MLPLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _, (batch,) in zip(range(args.steps), loader):
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
