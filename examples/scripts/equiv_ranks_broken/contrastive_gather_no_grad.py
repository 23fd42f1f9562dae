"""A two-tower contrastive model (CLIP-style) trained with DDP and a local loss whose features are gathered with
torch.distributed.all_gather, which returns copies without gradient: each rank puts its own features back, so its
rows train, but what its features contribute as the other ranks' negatives never reaches its gradient. The gradient
points elsewhere than the one-process gradient on the same global batch (not a scale: the direction changes), and
nothing raises. Written from open_clip's `--gather-with-grad` option (https://github.com/mlfoundations/open_clip,
src/open_clip/loss.py gather_features: "enable full distributed gradient for feature gather"),
https://github.com/ShiqiYu/OpenGait/issues/36 ("only the embeddings inside current GPU can backward gradients") and
https://github.com/texttron/tevatron/issues/143.

    torchrun --nproc_per_node=2 contrastive_gather_no_grad.py --steps 100
    gradprobe check_equivalence --script contrastive_gather_no_grad.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["image.0.weight"],
          "line": 42, "args": ["--steps=4"]}


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1), self.logit_scale.exp()


def gather(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.zeros_like(x) for _ in range(world)]
    dist.all_gather(out, x)
    out[rank] = x  # this rank's rows keep their gradient; the other ranks' copies have none
    return torch.cat(out)


def local_clip_loss(image, text, scale):
    all_image, all_text = gather(image), gather(text)
    labels = torch.arange(image.shape[0]) + image.shape[0] * dist.get_rank()
    return (F.cross_entropy(scale * image @ all_text.T, labels) + F.cross_entropy(scale * text @ all_image.T, labels)) / 2


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)

data = TensorDataset(torch.randn(64, 12), torch.randn(64, 10))
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = DDP(TwoTowers())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for images, texts in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    loss = local_clip_loss(*model(images, texts))
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
