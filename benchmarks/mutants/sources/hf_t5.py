"""Driver: a tiny T5 encoder-decoder, from a local copy of transformers' modeling_t5.py (which the bench mutates)."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn.functional as F
from transformers import T5Config

import modeling_t5


def build_model():
    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
                      attn_implementation="eager")
    model = modeling_t5.T5ForConditionalGeneration(config)
    return model


def make_inputs():
    input_ids = torch.randint(1, 64, (2, 10))
    return {"input_ids": input_ids, "labels": torch.randint(1, 64, (2, 6))}


def loss_fn(out, batch):
    loss = F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)), batch["labels"].reshape(-1))
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
