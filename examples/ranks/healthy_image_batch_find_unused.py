"""The twin of gp703_image_batch_on_one_rank.py: the same vision-language model and modality-grouped batches, and
build_model() wraps the model itself in DistributedDataParallel with find_unused_parameters=True (the fix the DDP
error message and https://github.com/hiyouga/LlamaFactory/issues/5680 suggest for a tower that is skipped on some
batches). DDP then reduces a zero gradient for the rank whose batch had no images, so the ranks stay equal: the
skipped image encoder is reported as info only. gradprobe initialised the process group before build_model(), so the
wrap works as written, and it does not wrap the model a second time.

    gradprobe diagnose examples/ranks/healthy_image_batch_find_unused.py --world-size 2
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

EXPECT = {"tool": "diagnose", "world_size": 2, "healthy": True, "codes": ["GP703"], "culprits": ["vision.0.weight"],
          "severity": "info", "absent": ["GP704", "GP706", "GP707"]}

VOCAB, D, IMAGE_SHARE = 50, 16, 0.5


class TinyVLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.vision = nn.Sequential(nn.Linear(12, D), nn.GELU(), nn.Linear(D, D))  # patch features -> image tokens
        self.mixer = nn.Linear(D, D)
        self.lm_head = nn.Linear(D, VOCAB)

    def forward(self, input_ids, pixel_values=None):
        h = self.embed(input_ids)
        if pixel_values is not None:  # text-only batches skip the image encoder
            h = torch.cat([self.vision(pixel_values), h], dim=1)
        h = torch.tanh(h + self.mixer(h.mean(dim=1, keepdim=True)))  # every text token sees the image tokens
        return self.lm_head(h[:, -input_ids.shape[1]:])


def build_model():
    return DistributedDataParallel(TinyVLM(), find_unused_parameters=True)


def make_inputs():
    image_batch = bool(torch.rand(()) < IMAGE_SHARE)  # grouped by modality: all images or none
    ids = torch.randint(0, VOCAB, (4, 6))
    return {"input_ids": ids, "pixel_values": torch.randn(4, 3, 12) if image_batch else None,
            "labels": torch.randint(0, VOCAB, (4, 6))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1))


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
