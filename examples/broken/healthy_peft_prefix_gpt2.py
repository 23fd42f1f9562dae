"""Healthy PEFT prefix tuning of a tiny GPT-2: the prefix reaches the base as past_key_values by design."""
import torch
from peft import PrefixTuningConfig, TaskType, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "verify_prompt_tuning", "codes": [], "culprits": [], "healthy": True}


def build_model():
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))
    return get_peft_model(base, PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4))


def make_inputs():
    input_ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
