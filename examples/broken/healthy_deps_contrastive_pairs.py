"""A two-tower contrastive model (CLIP-style): the forward returns the (B, B) similarity matrix, logits[i, j] =
scale * image_i . text_j, and the loss is the symmetric cross-entropy against the diagonal. Row i of the output reads
every example of the batch by design (its columns are the other examples' texts); each entry (i, j) reads image i and
text j only. check_dependencies measures that per entry, and says so, instead of a false GP902 on the rows.
Written after open_clip's `CLIP.forward` and `ClipLoss` (https://github.com/mlfoundations/open_clip)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP902"]}
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
        s = h.transpose(0, 1)  # (T, B, D): MultiheadAttention's sequence-first layout
        s = s + self.attn(s, s, s, need_weights=False)[0]
        return self.proj(s.transpose(0, 1).mean(dim=1))


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
