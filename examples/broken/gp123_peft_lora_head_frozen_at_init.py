"""A sequence classifier fine-tuned with LoRA whose new head stayed frozen at its random initialisation: the model
class creates the classification head (missing from the pretrained checkpoint, initialised at random), and
`get_peft_model` with a LoraConfig that declares neither `task_type` nor `modules_to_save` freezes everything but the
adapters, the head included. The loss moves (the adapters fit around the random head), every adapter gets a gradient,
and the head never learns: GP123 (error) at the get_peft_model line, naming the config's keys.

Public reports: https://github.com/huggingface/peft/issues/577 (`modules_to_save=...append("score")` is None: the head
keeps its random initialisation), https://github.com/huggingface/peft/issues/1070 (modules_to_save with
AutoModelForSequenceClassification), https://github.com/4AI/LS-LLaMA/issues/3 ("LoRA seems not training the linear
head for classification").
"""
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForSequenceClassification, BertConfig, BertModel

EXPECT = {"tool": "diagnose", "codes": ["GP123"], "culprits": ["base_model.model.classifier.weight"], "line": 35,
          "severity": "error"}


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
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"])
    return get_peft_model(model, config)


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 64, (4, 10), generator=g), "labels": torch.randint(0, 3, (4,), generator=g)}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
