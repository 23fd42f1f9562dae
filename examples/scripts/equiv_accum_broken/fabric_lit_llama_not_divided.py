"""A small causal LM fine-tuned the way Lightning-AI/lit-llama's finetune scripts did before
https://github.com/Lightning-AI/lit-llama/pull/357, on Lightning Fabric (strategy="ddp", `fabric.launch()`,
`fabric.setup`, `fabric.no_backward_sync`, `fabric.backward`): no DataLoader (get_batch() picks torch.randint indices
into a list of tokenized examples and stacks them by hand), gradient accumulation over `--accum` micro-batches, and
`fabric.backward(loss)` without dividing the loss by the accumulation steps. Fabric divides nothing itself, so every
optimizer step gets the sum of the micro-batches' mean gradients: k times the gradient of the same examples as one
batch. Under AdamW the update barely changes, but gradient clipping, eps and any switch to SGD see the k. Nothing
raises. The fix in the PR: `fabric.backward(loss / gradient_accumulation_iters)` (the healthy twin
equiv_accum/fabric_lit_llama_divided.py); litgpt, lit-llama's successor, trains the same way on Fabric.

    torchrun --nproc_per_node=2 fabric_lit_llama_not_divided.py --iters 100
    gradprobe check_equivalence --script fabric_lit_llama_not_divided.py --world-size 2 --reference-args="--accum=1" -- --iters=8
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP802"], "culprits": ["head.weight"],
          "line": 86, "args": ["--iters=8"], "ratio_is": "k", "severity": "warning",
          "options": {"compare": ["accumulation"], "reference": {"args": ["--accum=1"]}}}


class TinyLM(nn.Module):
    def __init__(self, vocab=48, dim=32, block=16):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.mix = nn.TransformerEncoderLayer(dim, 2, 64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        return self.head(self.mix(self.embed(idx) + self.pos(torch.arange(t)), src_mask=mask))


def make_data(n=64, length=16, prompt=6, vocab=48):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(1, vocab, (length,), generator=g)
        labels = ids.clone()
        labels[:prompt] = -1  # the prompt is not trained on, as lit-llama's prepare scripts mask it
        out.append({"input_ids": ids, "labels": labels})
    return out


def get_batch(fabric, data, micro_batch_size):
    ix = torch.randint(len(data), (micro_batch_size,))
    input_ids = torch.stack([data[i]["input_ids"].type(torch.int64) for i in ix])
    labels = torch.stack([data[i]["labels"].type(torch.int64) for i in ix])
    return fabric.to_device((input_ids, labels))


def loss_fn(logits, targets):
    logits = logits[..., :-1, :].contiguous()
    targets = targets[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=100)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--micro_batch_size", type=int, default=2)
parser.add_argument("--devices", type=int, default=2)
args = parser.parse_args()

fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy="ddp")
fabric.launch()
fabric.seed_everything(1337 + fabric.global_rank)
train_data = make_data()
with fabric.init_module():
    model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
model, optimizer = fabric.setup(model, optimizer)

for iter_num in range(args.iters):
    is_accumulating = (iter_num + 1) % args.accum != 0
    input_ids, targets = get_batch(fabric, train_data, args.micro_batch_size)
    with fabric.no_backward_sync(model, enabled=is_accumulating):
        logits = model(input_ids)
        loss = loss_fn(logits, targets)
        fabric.backward(loss)  # not divided by args.accum
    if not is_accumulating:
        optimizer.step()
        optimizer.zero_grad()
