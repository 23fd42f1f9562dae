"""A small decoder whose sliding-window path masks the future with triu(diagonal=2): output t sees input t+1 whenever
`config.sliding_window` is set (the full-attention path is right). Window masks are easy to get off by one:
huggingface/transformers#29623 (eager and FlashAttention sliding windows differ by one token), #39408."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_dependencies", "codes": ["GP901"], "culprits": ["sliding_window"], "line": 27}


@dataclass
class Config:
    vocab: int = 64
    dim: int = 32
    heads: int = 2
    layers: int = 2
    window: int = 4
    sliding_window: bool = True


def attention_mask(cfg: Config, T: int) -> torch.Tensor:
    """True where position t may attend."""
    ones = torch.ones(T, T, dtype=torch.bool)
    if cfg.sliding_window:
        future = torch.triu(ones, diagonal=2)
        too_old = torch.tril(ones, diagonal=-cfg.window)
        return ~(future | too_old)
    return ~torch.triu(ones, diagonal=1)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(C, dim=2)
        q, k, v = (z.view(B, T, self.cfg.heads, C // self.cfg.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(self.cfg, T))
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(64, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return TinyLM(Config())


def make_inputs():
    data = torch.randint(0, 64, (4, 17))
    return {"idx": data[:, :-1], "targets": data[:, 1:]}


def loss_fn(logits, batch):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
