"""Healthy: soft-prompt tuning by wrapping GPT-2's token embedding (a SoftEmbedding that holds learned_embedding)."""
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "verify_prompt_tuning", "codes": [], "culprits": [], "healthy": True}
N_PROMPT = 4


class SoftEmbedding(nn.Module):
    """Replaces the input embedding: the first N_PROMPT positions get learned vectors instead of token rows."""

    def __init__(self, wte: nn.Embedding, n_tokens: int):
        super().__init__()
        self.wte = wte
        self.n_tokens = n_tokens
        self.learned_embedding = nn.Parameter(wte.weight[:n_tokens].detach().clone())

    def forward(self, tokens):
        token_embeds = self.wte(tokens[:, self.n_tokens:])
        learned = self.learned_embedding.unsqueeze(0).expand(tokens.size(0), -1, -1)
        return torch.cat([learned, token_embeds], 1)


def build_model():
    # GPT2LMHeadModel.from_pretrained("gpt2") in a real run; random weights here
    lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=96, n_positions=64))
    lm.requires_grad_(False)
    lm.set_input_embeddings(SoftEmbedding(lm.get_input_embeddings(), N_PROMPT))
    return lm


def make_inputs():
    ids = torch.randint(4, 96, (2, 10))
    input_ids = torch.cat([torch.full((2, N_PROMPT), 50 % 96), ids], 1)  # placeholder ids where the prompt goes
    attention_mask = torch.ones_like(input_ids)
    labels = torch.cat([torch.full((2, N_PROMPT), -100), ids], 1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train_step(model, batch, optimizer):
    out = model(**batch)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()
