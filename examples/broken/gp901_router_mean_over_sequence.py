"""A small decoder whose mixture-of-experts MLP routes at the sequence level: the router's scores are averaged over the
sequence (`scores.mean(dim=1)`) and every position uses the same expert weights. The attention is causal; the routing
is not: output t reads the tokens after it through the average, and training copies the answer from it. Shwai-He/MEO#2
("sequence level routing which take the mean ... w.r.t the sequence dim ... Will this cause information leakage")
and karpathy/nanochat#844 (averages over a block broadcast back to every position collapse val_bpb) describe it.
check_dependencies names the routed MLP as the module that computes the leak (its input does not have it, its output
does, it makes no attention call), not the attention."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_dependencies", "codes": ["GP901"], "culprits": ["moe"], "line": 24}
VOCAB, DIM, EXPERTS = 64, 32, 4


class SequenceRoutedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                                      for _ in range(EXPERTS)])

    def forward(self, x):
        weights = self.router(x).softmax(-1).mean(dim=1, keepdim=True)  # (B, 1, E): one routing per sequence
        return sum(weights[..., e:e + 1] * expert(x) for e, expert in enumerate(self.experts))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.moe = SequenceRoutedMLP()

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
