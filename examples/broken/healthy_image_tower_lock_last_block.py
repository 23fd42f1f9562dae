"""Healthy twin of gp105_image_tower_lock_off_by_one.py: the same two-tower model locked with
`lock_image_tower(unlocked_groups=2)`, which unlocks the last vision block (with the final norm) and the projection,
as meant. The report's trainable set by module shows `visual.blocks: 1 of 4 Block trainable (3)`.

Written (not copied) after open_clip's `VisionTransformer.lock` (https://github.com/mlfoundations/open_clip/pull/523).
"""
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "inspect_parameters", "codes": ["GP105"], "culprits": ["visual.blocks.2.attn.weight"],
          "severity": "info", "healthy": True, "options": {}}
UNLOCKED_GROUPS = 2  # the last vision block (and the final norm) and the projection train


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class VisionTower(nn.Module):
    def __init__(self, d=16, layers=4, patch=4, out=8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, d, patch, patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(d) * d ** -0.5)
        self.positional_embedding = nn.Parameter(torch.randn(5, d) * d ** -0.5)
        self.ln_pre = nn.LayerNorm(d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_post = nn.LayerNorm(d)
        self.proj = nn.Parameter(torch.randn(d, out) * d ** -0.5)

    def lock(self, unlocked_groups=0):
        for p in self.parameters():
            p.requires_grad = False
        if unlocked_groups:
            groups = [[self.conv1, self.class_embedding, self.positional_embedding, self.ln_pre],
                      *self.blocks[:-1], [self.blocks[-1], self.ln_post], self.proj]
            for g in groups[-unlocked_groups:]:
                for x in g if isinstance(g, list) else [g]:
                    if isinstance(x, nn.Parameter):
                        x.requires_grad = True
                    else:
                        for p in x.parameters():
                            p.requires_grad = True

    def forward(self, images):
        x = self.conv1(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], 1) + self.positional_embedding
        x = self.ln_pre(x)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x[:, 0]) @ self.proj


class TextTower(nn.Module):
    def __init__(self, vocab=32, d=16, layers=4, ctx=6, out=8):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d)
        self.positional_embedding = nn.Parameter(torch.randn(ctx, d) * 0.01)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_final = nn.LayerNorm(d)
        self.text_projection = nn.Parameter(torch.randn(d, out) * d ** -0.5)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.positional_embedding
        for block in self.blocks:
            x = block(x)
        return self.ln_final(x[:, -1]) @ self.text_projection


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = VisionTower()
        self.text = TextTower()
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def lock_image_tower(self, unlocked_groups=0):
        self.visual.lock(unlocked_groups)

    def forward(self, images, tokens):
        img = F.normalize(self.visual(images), dim=-1)
        txt = F.normalize(self.text(tokens), dim=-1)
        return self.logit_scale.exp() * img @ txt.t()


def _pretrained_visual():
    """A pretrained image tower's weights (a tiny stand-in, saved once in a temporary folder)."""
    path = os.path.join(tempfile.mkdtemp(), "visual.pt")
    torch.manual_seed(7)
    torch.save(VisionTower().state_dict(), path)
    return torch.load(path)


def build_model():
    model = TwoTower()
    model.visual.load_state_dict(_pretrained_visual())
    model.lock_image_tower(unlocked_groups=UNLOCKED_GROUPS)
    return model


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 32, (4, 6), generator=g)


def loss_fn(logits, batch):
    labels = torch.arange(logits.shape[0])
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
