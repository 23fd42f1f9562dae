"""Healthy twin of equiv_ranks_broken/token_mean_per_rank.py: each rank divides its token sum by the global batch's
number of target tokens (all-reduced across ranks) and multiplies by the world size, which DDP's average divides
back out: every token weighs the same as in one process on the global batch. This is what
https://github.com/huggingface/transformers/pull/34373 (average_tokens_across_devices) does for the Trainer, after
https://github.com/huggingface/transformers/issues/34242.

    torchrun --nproc_per_node=2 token_mean_global.py --steps 100
    gradprobe check_equivalence --script token_mean_global.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "args": ["--steps=4"],
          "absent": ["GP801"]}
VOCAB, LENGTH = 40, 12


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def make_data(n=64):
    ids = torch.randint(0, VOCAB, (n, LENGTH))
    lengths = torch.randint(2, LENGTH + 1, (n,))
    labels = torch.where(torch.arange(LENGTH) < lengths[:, None], ids.roll(-1, dims=1), torch.tensor(-100))
    return TensorDataset(ids, labels)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
data = make_data()
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True, seed=0))
model = DDP(TinyLM())
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for ids, labels in itertools.islice(loader, args.steps):
    optimizer.zero_grad()
    token_sum = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), reduction="sum")
    count = (labels != -100).sum()
    dist.all_reduce(count)  # the global batch's token count
    loss = token_sum * dist.get_world_size() / count
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
