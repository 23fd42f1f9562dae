"""A token classifier over nn.MultiheadAttention (sequence-first by default): the (B, T, D) activations are handed to it
with `.view(T, B, D)` where a transpose was meant, so each "sequence" the attention sees mixes tokens of several
examples, and every example's output depends on the others (rish-16/tokenlearner-pytorch#1: "y = y.view(8, 512, 3)
is wrong ... should be y.transpose(0, 1)"; jsbaan/transformer-from-scratch#6: a reshape without its permute)."""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_dependencies", "codes": ["GP902"], "culprits": ["view"], "line": 21}


class Tagger(nn.Module):
    def __init__(self, vocab=64, dim=16, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, num_heads=2)
        self.out = nn.Linear(dim, tags)

    def forward(self, tokens):
        x = self.emb(tokens)
        B, T, D = x.shape
        x = x.view(T, B, D)
        h, _ = self.attn(x, x, x)
        return self.out(h.view(B, T, D))


def build_model():
    return Tagger()


def make_inputs():
    return {"tokens": torch.randint(0, 64, (4, 6)), "tags": torch.randint(0, 5, (4, 6))}


def loss_fn(logits, batch):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["tags"].reshape(-1))
