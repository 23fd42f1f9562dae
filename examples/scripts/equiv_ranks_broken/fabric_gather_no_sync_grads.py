"""A two-tower contrastive model (CLIP-style) trained with Lightning Fabric (strategy="ddp", `fabric.launch()`,
`fabric.setup`, `fabric.backward`) and a local loss whose features are gathered with `fabric.all_gather(x)`, whose
`sync_grads` is False by default: the gathered copies carry no gradient. Each rank puts its own rows back, so they
train, but what its features contribute as the other ranks' negatives never reaches its gradient: the 2-process
gradient points elsewhere than the one-process gradient on the same global batch, and nothing raises. Written from
https://github.com/Lightning-AI/pytorch-lightning/issues/4725 ("the default all_gather in pytorch breaks the gradient
graph as it does not propagate any gradient backwards"; `sync_grads=True` came with
https://github.com/Lightning-AI/pytorch-lightning/pull/5012) and open_clip's `--gather-with-grad`
(https://github.com/mlfoundations/open_clip, src/open_clip/loss.py gather_features).

    torchrun --nproc_per_node=2 fabric_gather_no_sync_grads.py --steps 100
    gradprobe check_equivalence --script fabric_gather_no_sync_grads.py --world-size 2 -- --steps=4
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["image.0.weight"],
          "line": 28, "args": ["--steps=4"]}


def gather(fabric, x):
    parts = list(fabric.all_gather(x).reshape(fabric.world_size, *x.shape).unbind(0))  # copies without gradient
    parts[fabric.global_rank] = x  # this rank's rows keep theirs
    return torch.cat(parts)


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
