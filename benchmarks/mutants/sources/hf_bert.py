"""Driver: a tiny BERT sequence classifier, from a local copy of transformers' modeling_bert.py (which the bench mutates)."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn.functional as F
from transformers import BertConfig

import modeling_bert


def build_model():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, num_labels=3, attn_implementation="eager")
    model = modeling_bert.BertForSequenceClassification(config)
    return model


def make_inputs():
    input_ids = torch.randint(0, 64, (2, 10))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": torch.tensor([0, 2])}


def loss_fn(out, batch):
    loss = F.cross_entropy(out.logits, batch["labels"])
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
