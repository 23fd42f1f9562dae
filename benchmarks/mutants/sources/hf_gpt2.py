"""Driver: a tiny GPT-2 language model, from a local copy of transformers' modeling_gpt2.py (which the bench mutates)."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn.functional as F
from transformers import GPT2Config

import modeling_gpt2


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32, attn_implementation="eager")
    model = modeling_gpt2.GPT2LMHeadModel(config)
    return model


def make_inputs():
    input_ids = torch.randint(0, 64, (2, 10))
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def loss_fn(out, batch):
    logits = out.logits[:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["labels"][:, 1:].reshape(-1))
    return loss


def make_optimizer(model):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([
        {"params": decay, "weight_decay": 0.01},
        {"params": no_decay, "weight_decay": 0.0},
    ], lr=1e-3)
    return optimizer


def train_step(model, batch, optimizer):
    model.train()
    optimizer.zero_grad()
    out = model(**batch)
    loss = loss_fn(out, batch)
    loss.backward()
    optimizer.step()
    return loss.item()
