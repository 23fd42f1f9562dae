"""A PEFT LoRA set-up on a tiny GPT-2 (the PEFT README recipe): adapters on c_attn, base frozen by PEFT."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 64


def build_model():
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32))
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True)
    model = get_peft_model(base, config)
    return model


def make_inputs():
    input_ids = torch.randint(0, VOCAB, (2, 10))
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def make_optimizer(model):
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    return optimizer


def train_step(model, batch, optimizer):
    model.train()
    out = model(**batch)
    loss = out.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()  # after the step, as in the PEFT examples
    return loss.item()
