"""Soft-prompt tuning of a frozen GPT-2: learned virtual-token embeddings prepended to the input."""

import copy  # noqa: F401 (used by the bench's module_replaced mutants)
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

N_PROMPT = 6
VOCAB = 64


class SoftPromptLM(nn.Module):
    def __init__(self, config, n_prompt=N_PROMPT):
        super().__init__()
        self.lm = GPT2LMHeadModel(config)
        self.lm.requires_grad_(False)
        self.prompt = nn.Parameter(torch.randn(n_prompt, config.n_embd) * 0.02)

    def forward(self, input_ids, attention_mask, labels):
        b = input_ids.size(0)
        n = self.prompt.size(0)
        tokens = self.lm.get_input_embeddings()(input_ids)
        prompt = self.prompt.unsqueeze(0).expand(b, -1, -1)
        inputs_embeds = torch.cat([prompt, tokens], dim=1)
        attention_mask = torch.cat([attention_mask.new_ones(b, n), attention_mask], dim=1)
        labels = torch.cat([labels.new_full((b, n), -100), labels], dim=1)
        out = self.lm(inputs_embeds=inputs_embeds, attention_mask=attention_mask, labels=labels)
        return out


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32)
    model = SoftPromptLM(config)
    return model


def make_inputs():
    input_ids = torch.randint(0, VOCAB, (2, 10))
    attention_mask = torch.ones_like(input_ids)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": input_ids.clone()}


def make_optimizer(model):
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=3e-2)
    return optimizer


def train_step(model, batch, optimizer):
    model.train()
    out = model(**batch)
    loss = out.loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
