"""Healthy PEFT LoRA on a tiny GPT-2 (the README set-up): adapters are not a prompt, and lora_A's
zero gradient at the first step is by design (lora_B starts at zero)."""
import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "diagnose", "codes": ["GP306"], "culprits": ["lora_A"], "severity": "info", "healthy": True}


def build_model():
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))
    config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["c_attn"])
    return get_peft_model(base, config)


def make_inputs():
    input_ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
