"""Contrastive accumulation with cached features in a train_step (open_clip's `--accum-freq`, GradCache): the micro-
batches' features are computed once without gradient, then each micro-batch again with gradient, put in place of its
cached copy, and the loss over the whole batch backpropagated: k backward() calls, no division, and the towers'
accumulated gradient is the whole batch's. The shared logit scale enters every one of the k losses and gets k times
its one-batch gradient, which AdamW does not see (GP806, info). Public references:
https://github.com/mlfoundations/open_clip (src/open_clip_train/train.py, accum_freq), https://github.com/luyug/GradCache.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_equivalence", "codes": [], "healthy": True, "absent": ["GP802"], "options": {"steps": 2}}
ACCUM = 2


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1), self.logit_scale.exp()


def build_model():
    return TwoTowers()


def make_inputs():
    return {"images": torch.randn(8, 12), "texts": torch.randn(8, 10)}


def clip_losses(image, text, scale):
    labels = torch.arange(image.shape[0])
    return {"image_to_text": F.cross_entropy(scale * image @ text.T, labels),
            "text_to_image": F.cross_entropy(scale * text @ image.T, labels)}


def loss_fn(out, batch):
    return sum(clip_losses(*out).values())


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, batch, optimizer):
    micro = list(zip(batch["images"].chunk(ACCUM), batch["texts"].chunk(ACCUM), strict=True))
    with torch.no_grad():
        cached = [model(images, texts)[:2] for images, texts in micro]
    optimizer.zero_grad()
    for j, (images, texts) in enumerate(micro):
        image, text, scale = model(images, texts)
        all_image = torch.cat([c[0] for c in cached[:j]] + [image] + [c[0] for c in cached[j + 1:]])
        all_text = torch.cat([c[1] for c in cached[:j]] + [text] + [c[1] for c in cached[j + 1:]])
        total_loss = sum(clip_losses(all_image, all_text, scale).values())  # as open_clip's train loop sums them
        total_loss.backward()
    optimizer.step()
