"""Contrastive accumulation with cached features (open_clip's `--accum-freq`, GradCache) and an off-by-one: each
micro-batch's recomputed features are put in beside its cached copy instead of in its place (cached[j:] where
cached[j + 1:] was meant), so every loss counts that micro-batch twice among the negatives. The accumulated gradient
points elsewhere than the gradient of the same examples as one batch, and nothing raises: the loss still goes down.
Written from open_clip's accumulation (https://github.com/mlfoundations/open_clip, src/open_clip_train/train.py:
"torch.cat(accumulated[:j] + [model_out[key]] + accumulated[j + 1:])") and https://github.com/luyug/GradCache.

    python contrastive_counted_twice.py --accum-freq 2
    gradprobe check_equivalence --script contrastive_counted_twice.py --reference-args="--accum-freq 1" -- --steps 4
"""

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "codes": ["GP802"], "culprits": ["image.0.weight", "text.2.bias"],
          "line": 61, "args": ["--steps=4"], "options": {"reference": {"args": ["--accum-freq", "1"]}}}


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1), self.logit_scale.exp()


def clip_losses(image, text, scale):
    labels = torch.arange(image.shape[0])
    return {"image_to_text": F.cross_entropy(scale * image @ text.T, labels),
            "text_to_image": F.cross_entropy(scale * text @ image.T, labels)}


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--accum-freq", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(0)

data = TensorDataset(torch.randn(256, 12), torch.randn(256, 10))
batches = iter(DataLoader(data, batch_size=4, shuffle=True))
model = TwoTowers()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(args.steps):
    micro = list(itertools.islice(batches, args.accum_freq))
    with torch.no_grad():  # first, cache every micro-batch's features without gradient
        cached = [model(images, texts)[:2] for images, texts in micro]
    optimizer.zero_grad()
    for j, (images, texts) in enumerate(micro):
        image, text, scale = model(images, texts)  # this micro-batch again, with gradient
        all_image = torch.cat([c[0] for c in cached[:j]] + [image] + [c[0] for c in cached[j:]])
        all_text = torch.cat([c[1] for c in cached[:j]] + [text] + [c[1] for c in cached[j:]])
        total_loss = sum(clip_losses(all_image, all_text, scale).values())  # as open_clip's train loop sums them
        total_loss.backward()
    optimizer.step()
