"""A training script in the style of nanoGPT's train.py: argparse config, a data file,
an evaluation under no_grad before training, gradient accumulation, a warm-up schedule,
checkpoints written to out_dir.

    python train.py --max_iters=20 --device=cpu
"""

import argparse
import math
import os

import torch

from model import GPT

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", default="out")
parser.add_argument("--data", default="data/input.txt")
parser.add_argument("--max_iters", type=int, default=2000)
parser.add_argument("--eval_interval", type=int, default=250)
parser.add_argument("--eval_iters", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--block_size", type=int, default=16)
parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
parser.add_argument("--learning_rate", type=float, default=6e-4)
parser.add_argument("--warmup_iters", type=int, default=10)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

os.makedirs(args.out_dir, exist_ok=True)
torch.manual_seed(1337)

with open(args.data, encoding="utf-8") as f:
    text = f.read()
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
splits = {"train": data[:n], "val": data[n:]}


def get_batch(split):
    d = splits[split]
    ix = torch.randint(len(d) - args.block_size, (args.batch_size,))
    x = torch.stack([d[i:i + args.block_size] for i in ix])
    y = torch.stack([d[i + 1:i + 1 + args.block_size] for i in ix])
    return x.to(args.device), y.to(args.device)


model = GPT(len(chars), args.block_size).to(args.device)
optimizer = model.configure_optimizers(0.1, args.learning_rate, (0.9, 0.95))


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < args.warmup_iters:
        return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
    return args.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, it / args.max_iters)))


X, Y = get_batch("train")
for iter_num in range(args.max_iters):
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if iter_num % args.eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        torch.save({"model": model.state_dict(), "iter_num": iter_num}, os.path.join(args.out_dir, "ckpt.pt"))
    for micro_step in range(args.gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / args.gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print("done")
