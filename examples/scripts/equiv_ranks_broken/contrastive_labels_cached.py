"""A two-tower contrastive model (CLIP-style) trained with DDP and a local loss whose labels are cached before the
rank offset: at the first step each rank builds arange(b) + rank * b and is right; from the second step on the cache
gives every rank arange(b), so rank 1 takes rank 0's examples as its positives. Step 1's gradient equals the
one-process gradient on the same global batch; step 2's does not, on rank 1 only. Written from open_clip's ClipLoss
label cache (https://github.com/mlfoundations/open_clip, src/open_clip/loss.py get_ground_truth: "labels = labels +
num_logits * self.rank" before "self.labels[device] = labels"; refactored in
https://github.com/mlfoundations/open_clip/pull/427): the offset must be applied before the labels are cached.

    torchrun --nproc_per_node=2 contrastive_labels_cached.py --steps 100
    gradprobe check_equivalence --script contrastive_labels_cached.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["image.0.weight"],
          "line": 54, "args": ["--steps=4"], "step": 2}


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1), self.logit_scale.exp()


class LocalClipLoss:
    def __init__(self, rank):
        self.rank, self.prev_num_logits, self.labels = rank, 0, None

    def ground_truth(self, num_logits):
        if num_logits != self.prev_num_logits:
            labels = torch.arange(num_logits)
            self.labels, self.prev_num_logits = labels, num_logits  # cached before the offset
            return labels + num_logits * self.rank
        return self.labels

    def __call__(self, image, text, scale):
        all_image = torch.cat(dist_fn.all_gather(image))
        all_text = torch.cat(dist_fn.all_gather(text))
        labels = self.ground_truth(image.shape[0])
        return (F.cross_entropy(scale * image @ all_text.T, labels) + F.cross_entropy(scale * text @ all_image.T, labels)) / 2


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)

data = TensorDataset(torch.randn(64, 12), torch.randn(64, 10))
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = DDP(TwoTowers())
loss_fn = LocalClipLoss(dist.get_rank())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for images, texts in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    loss = loss_fn(*model(images, texts))
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
