"""Healthy twin of gp123_peft_lora_head_frozen_at_init.py: the LoraConfig declares `task_type="SEQ_CLS"`, so
get_peft_model keeps a trainable copy of the new classification head (and saves it with the adapter). The frozen
original of the head stays at its initialisation but is off the path to the loss: no GP123.

Written after https://github.com/huggingface/peft/issues/1070 and peft's docs on `modules_to_save`.
"""
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForSequenceClassification, BertConfig, BertModel

EXPECT = {"tool": "diagnose", "codes": [], "healthy": True, "absent": ["GP123"]}


def pretrained_backbone():
    """A tiny stand-in for a pretrained encoder, saved in a temporary folder (no download)."""
    path = tempfile.mkdtemp()
    torch.manual_seed(1)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=32)
    BertModel(config).save_pretrained(path)
    return path


def build_model():
    model = AutoModelForSequenceClassification.from_pretrained(pretrained_backbone(), num_labels=3)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], task_type="SEQ_CLS")
    return get_peft_model(model, config)


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 64, (4, 10), generator=g), "labels": torch.randint(0, 3, (4,), generator=g)}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
