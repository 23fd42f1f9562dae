"""Driver: a tiny ResNet image classifier, from a local copy of transformers' modeling_resnet.py (which the bench mutates)."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn.functional as F
from transformers import ResNetConfig

import modeling_resnet


def build_model():
    torch.manual_seed(0)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3)
    model = modeling_resnet.ResNetForImageClassification(config)
    return model


def make_inputs():
    return {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 2])}


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
