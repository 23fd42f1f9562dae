"""Healthy: prefix tuning by hand. Learned keys and values (`memory`, not named like a prompt) are handed to a frozen
GPT-2 as its key/value cache, as PEFT's prefix tuning does (https://github.com/huggingface/peft/issues/462 discusses
the prefix family). They are found as the prompt by what the code does with them, and the cache here is the prompt
itself: no "cache in training" warning (GP509), no sequence positions to align.
"""
import torch
import torch.nn as nn
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "verify_prompt_tuning", "codes": [], "culprits": [], "healthy": True, "absent": ["GP509", "GP501"]}
N_PREFIX = 4


class PrefixLM(nn.Module):
    def __init__(self):
        super().__init__()
        # GPT2LMHeadModel.from_pretrained("gpt2") in a real run; random weights here
        self.lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))
        self.lm.requires_grad_(False)
        self.memory = nn.Parameter(torch.randn(2, 2, 2, N_PREFIX, 16) * 0.02)  # layer, key/value, head, position, dim

    def forward(self, input_ids, attention_mask, labels):
        b = input_ids.size(0)
        cache = DynamicCache()
        for layer in range(self.memory.size(0)):
            kv = self.memory[layer].unsqueeze(1).expand(-1, b, -1, -1, -1)
            cache.update(kv[0], kv[1], layer)
        mask = torch.cat([attention_mask.new_ones(b, N_PREFIX), attention_mask], dim=1)
        return self.lm(input_ids=input_ids, past_key_values=cache, attention_mask=mask, labels=labels)


def build_model():
    return PrefixLM()


def make_inputs():
    ids = torch.randint(4, 96, (2, 10))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([model.memory], lr=1e-2)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
