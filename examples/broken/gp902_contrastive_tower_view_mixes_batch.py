"""Broken twin of healthy_deps_contrastive_pairs.py: the towers put their tokens in MultiheadAttention's
sequence-first layout with `h.view(T, B, D)` instead of `h.transpose(0, 1)`. The shapes fit, the loss falls, and every
entry (i, j) of the similarity matrix now reads a third example's image through the scrambled rows: the model can
match pairs by batch position rather than content. The same mistake in a plain model is
gp902_view_instead_of_transpose.py (nn.MultiheadAttention takes (T, B, D) unless batch_first=True)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_dependencies", "codes": ["GP902"], "culprits": [], "line": 25}
DIM, VOCAB, OUT = 16, 32, 8


class Tower(nn.Module):
    """Patches or tokens -> per-token features -> self-attention over the example's own tokens -> mean-pooled."""

    def __init__(self, embed):
        super().__init__()
        self.embed = embed
        self.attn = nn.MultiheadAttention(DIM, 2)
        self.proj = nn.Linear(DIM, OUT)

    def forward(self, x):
        h = self.embed(x)  # (B, T, D)
        s = h.view(h.shape[1], h.shape[0], DIM)  # meant (T, B, D), the batch scrambled: should be transpose(0, 1)
        s = s + self.attn(s, s, s, need_weights=False)[0]
        return self.proj(s.view(h.shape).mean(dim=1))


class Patches(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, DIM, 4, 4)

    def forward(self, images):
        return self.conv(images).flatten(2).transpose(1, 2)  # (B, patches, D)


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = Tower(Patches())
        self.text = Tower(nn.Embedding(VOCAB, DIM))
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, images, tokens):
        img = F.normalize(self.visual(images), dim=-1)
        txt = F.normalize(self.text(tokens), dim=-1)
        return self.logit_scale.exp() * img @ txt.t()


def build_model():
    torch.manual_seed(0)
    return TwoTower()


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, VOCAB, (4, 6), generator=g)


def loss_fn(logits, batch):
    labels = torch.arange(logits.shape[0])
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
