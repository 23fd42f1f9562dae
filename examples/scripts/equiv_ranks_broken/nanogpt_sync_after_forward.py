"""A small GPT trained the way karpathy/build-nanogpt's train_gpt2.py trained it before
https://github.com/karpathy/build-nanogpt/pull/30: no DataLoader (get_batch() reads a uint16 np.memmap at torch.randint
offsets), gradient accumulation divided by the world size, and DDP's gradient sync switched on for the last micro-step
AFTER its forward, just before its backward. DistributedDataParallel decides in the forward whether the backward
all-reduces (`require_backward_grad_sync` is read there), so the last micro-step's gradient stays local on each rank
and the first one's is averaged: rank 0 steps on a gradient that is neither its own nor the global batch's, and
nothing raises. "I think nanoGPT is broken too, then" (karpathy, in the PR); nanoGPT sets it before the forward, as
the healthy twin equiv_ranks/nanogpt_ddp_accum.py does. Also https://github.com/KellerJordan/modded-nanogpt/pull/31.

    torchrun --nproc_per_node=2 nanogpt_sync_after_forward.py --max_iters 100
    gradprobe check_equivalence --script nanogpt_sync_after_forward.py --world-size 2 -- --max_iters=4
"""

import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["wte.weight"],
          "line": 114, "args": ["--max_iters=4"]}


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


parser = argparse.ArgumentParser()
parser.add_argument("--max_iters", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=2)
parser.add_argument("--block_size", type=int, default=16)
parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
parser.add_argument("--learning_rate", type=float, default=1e-3)
args = parser.parse_args()
gradient_accumulation_steps = args.gradient_accumulation_steps

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    ddp_rank, ddp_world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    seed_offset = ddp_rank
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    seed_offset = 0
torch.manual_seed(1337 + seed_offset)

data_dir = "data"


def get_batch(split):
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + args.block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block_size].astype(np.int64)) for i in ix])
    return x, y


def get_lr(it, warmup_iters=10):
    return args.learning_rate * min(1.0, (it + 1) / warmup_iters) * 0.5 * (1 + math.cos(math.pi * it / args.max_iters))


model = GPT(block_size=args.block_size)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
if ddp:
    model = DDP(model)

X, Y = get_batch("train")  # fetch the very first batch
for iter_num in range(args.max_iters):
    for param_group in optimizer.param_groups:
        param_group["lr"] = get_lr(iter_num)
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        X, Y = get_batch("train")  # prefetch the next batch while the model does the forward pass
        if ddp:
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)  # after the forward
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if ddp:
    destroy_process_group()
