"""Healthy by design: a prefix-LM (PaliGemma's and T5-prefix-LM's attention: the prompt tokens of each row see each
other both ways, the tokens after the prompt are causal; `token_type_ids` 0 marks the prompt, as PaliGemma's processor
does), trained on the tokens after the prompt only (labels -100 on the prompt). A prompt position reading a later
prompt position is the design, and the loss never predicts there: the causality claim holds, and is measured, on the
positions the loss predicts only; examples stay independent.

Public thread: https://github.com/huggingface/transformers/issues/30640 (PaliGemma's prefix-LM mask: bidirectional on
the prefix, causal on the suffix; a fix that made the prefix causal changed training).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP901", "GP902"]}
VOCAB, DIM = 48, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, T, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None])
        x = x + self.out(a.transpose(1, 2).reshape(B, T, DIM))
        return x + self.mlp(x)


class PrefixLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(32, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids, token_type_ids, labels):
        T = input_ids.shape[1]
        prompt = token_type_ids == 0
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        keep = causal | (prompt[:, :, None] & prompt[:, None, :])  # the prompt sees all of itself
        x = self.emb(input_ids) + self.pos(torch.arange(T))
        for block in self.blocks:
            x = block(x, keep)
        logits = self.head(x)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def build_model():
    torch.manual_seed(0)
    return PrefixLM()


def make_inputs():
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 12))
    token_type_ids = torch.ones_like(ids)
    for row, prompt in enumerate((4, 6, 3)):
        token_type_ids[row, :prompt] = 0
    labels = ids.masked_fill(token_type_ids == 0, -100)
    return {"input_ids": ids, "token_type_ids": token_type_ids, "labels": labels}


def loss_fn(out, batch):
    return out["loss"]


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
