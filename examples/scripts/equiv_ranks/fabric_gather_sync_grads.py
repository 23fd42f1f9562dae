"""Healthy twin of equiv_ranks_broken/fabric_gather_no_sync_grads.py: a two-tower contrastive model (CLIP-style)
trained with Lightning Fabric (strategy="ddp", `fabric.launch()`, `fabric.setup`, `fabric.backward`) and a local loss
whose features are gathered with `fabric.all_gather(x, sync_grads=True)`: the gather's backward sums each rank's
gradient for the gathered rows back to the rank that holds them, and the labels are offset by rank. Fabric's DDP
average of the ranks' gradients is then the gradient of the same loss over the global batch in one process. Public
reference: https://github.com/Lightning-AI/pytorch-lightning/pull/5012 (all_gather with sync_grads).

    torchrun --nproc_per_node=2 fabric_gather_sync_grads.py --steps 100
    gradprobe check_equivalence --script fabric_gather_sync_grads.py --world-size 2 -- --steps=4
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "args": ["--steps=4"],
          "absent": ["GP801", "GP806"]}


def gather(fabric, x):
    return fabric.all_gather(x, sync_grads=True).reshape(-1, *x.shape[1:])  # with the gradient back to each rank


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1), self.logit_scale.exp()


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--devices", type=int, default=2)
args = parser.parse_args()

fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy="ddp")
fabric.launch()
fabric.seed_everything(0)
model = TwoTowers()
model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
g = torch.Generator().manual_seed(0)
loader = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.randn(64, 12, generator=g), torch.randn(64, 10, generator=g)),
                                             batch_size=4))
for _, (images, texts) in zip(range(args.steps), loader):
    image, text, scale = model(images, texts)
    all_image, all_text = gather(fabric, image), gather(fabric, text)
    labels = torch.arange(image.shape[0]) + fabric.global_rank * image.shape[0]
    loss = (F.cross_entropy(scale * image @ all_text.T, labels) + F.cross_entropy(scale * text @ all_image.T, labels)) / 2
    optimizer.zero_grad()
    fabric.backward(loss)
    optimizer.step()
