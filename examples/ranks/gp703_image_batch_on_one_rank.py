"""A small vision-language model trained at two ranks: its image encoder runs only on batches that hold images.

The sampler groups the data by modality (as LLaVA's `group_by_modality_length` does), so a batch is all image-text
pairs or all text. At world size 2 one rank's batch has images and the other's has none: the image encoder's
parameters take part in the loss on rank 0 only, DistributedDataParallel's gradient bucket is never filled on rank 1,
and training stops with "Expected to have finished reduction in the prior iteration". Written from
https://github.com/hiyouga/LlamaFactory/issues/5680 (a VLM fine-tuned with its vision tower unfrozen on mixed data fails
after a while under DDP) and https://github.com/huggingface/trl/issues/6617 (a vision tower that never takes part in
the loss: "On >1 GPU training dies with DDP's generic reducer error, which does not name the cause").

gradprobe initialises the process group, wraps the returned model in DistributedDataParallel and calls make_inputs
on each rank after torch.manual_seed(seed + rank): with the default seed 0, rank 0 draws an image batch, rank 1 a
text batch.

    gradprobe diagnose examples/ranks/gp703_image_batch_on_one_rank.py --world-size 2
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "world_size": 2, "codes": ["GP703"],
          "culprits": ["vision.0.weight", "vision.2.bias"], "line": 39, "ranks": [1],
          "absent": ["GP704", "GP706", "GP112"]}

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
    return TinyVLM()


def make_inputs():
    image_batch = bool(torch.rand(()) < IMAGE_SHARE)  # grouped by modality: all images or none
    ids = torch.randint(0, VOCAB, (4, 6))
    return {"input_ids": ids, "pixel_values": torch.randn(4, 3, 12) if image_batch else None,
            "labels": torch.randint(0, VOCAB, (4, 6))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1))


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
