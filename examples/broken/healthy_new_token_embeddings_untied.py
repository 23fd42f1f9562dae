"""Healthy: new special tokens learned by training only the input embedding of a GPT-2 whose head is not tied to it."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "verify_prompt_tuning", "codes": [], "culprits": [], "healthy": True}
N_NEW = 3


def build_model():
    # GPT2LMHeadModel.from_pretrained("gpt2") in a real run; random weights here
    lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64, tie_word_embeddings=False))
    lm.resize_token_embeddings(96 + N_NEW)  # room for <task>, <sep>, <answer>
    lm.requires_grad_(False)
    lm.get_input_embeddings().weight.requires_grad_(True)  # learn the new rows
    return lm


def make_inputs():
    ids = torch.randint(0, 96, (2, 10))
    ids[:, 0] = 96  # <task>
    ids[:, 5] = 97  # <sep>
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
