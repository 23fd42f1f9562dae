"""A healthy control for gp805_tie_with_data.py: a language model whose output head is tied to the token embedding
the way transformers' tie_weights() does it, `self.head.weight = self.embed.weight`: one Parameter under two names
(GP108, info), trained once with both gradients summed. Distinct Parameters over one storage (GP805) it is not."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": ["GP108"], "culprits": ["embed.weight"], "healthy": True, "absent": ["GP805"]}


class TinyLM(nn.Module):
    def __init__(self, vocab=30, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def build_model():
    return TinyLM()


def make_inputs():
    ids = torch.randint(0, 30, (4, 7))
    return {"ids": ids, "labels": ids.roll(-1, dims=1)}


def loss_fn(out, batch):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), batch["labels"].reshape(-1))


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
