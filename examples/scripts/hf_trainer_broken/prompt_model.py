"""Soft-prompt tuning of a tiny GPT-2 (random init from a config): learned prompt vectors are
prepended to the token embeddings."""

import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel


class SoftPromptLM(nn.Module):
    def __init__(self, n_prompt=4):
        super().__init__()
        self.base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
        d = self.base.config.n_embd
        self.prompt = torch.randn(n_prompt, d, requires_grad=True)  # a plain tensor: not a parameter
        # the base is left trainable here (the healthy twin freezes it): with the prompt not a parameter, a frozen
        # base would leave the Trainer nothing to optimize, and it would stop before any step

    def forward(self, input_ids, attention_mask=None, labels=None):
        b = input_ids.size(0)
        tok = self.base.get_input_embeddings()(input_ids)
        embeds = torch.cat([self.prompt.unsqueeze(0).expand(b, -1, -1), tok], dim=1)
        n = self.prompt.size(0)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask.new_ones(b, n), attention_mask], dim=1)
        if labels is not None:
            labels = torch.cat([labels.new_full((b, n), -100), labels], dim=1)
        return self.base(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels)
