"""Healthy twin of gp901_router_mean_over_sequence.py: the same decoder with its mixture-of-experts MLP routed per
token (each position's own softmax over the experts, as Switch/Mixtral-style token-choice routers do): the routing
reads no other position, so output t depends on no input after t (measured), and the examples stay independent.
Shwai-He/MEO#2 is the issue its broken twin follows."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP901", "GP902"]}
VOCAB, DIM, EXPERTS = 64, 32, 4


class TokenRoutedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                                      for _ in range(EXPERTS)])

    def forward(self, x):
        weights = self.router(x).softmax(-1)  # (B, T, E): each position routed on its own
        return sum(weights[..., e:e + 1] * expert(x) for e, expert in enumerate(self.experts))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.moe = TokenRoutedMLP()

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, DIM))
        return x + self.moe(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    torch.manual_seed(0)
    return Decoder()


def make_inputs():
    torch.manual_seed(1)
    return {"ids": torch.randint(0, VOCAB, (2, 12))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["ids"][:, 1:].reshape(-1))
