"""A small token-level language model trained with DDP whose loss is each rank's token sum divided by that rank's own
number of target tokens. Batches pad to a fixed length with labels -100, so the ranks hold different numbers of real
tokens: DDP's average of per-rank token means weighs a token of a rank with few tokens more than one of a rank with
many, and the gradient is not the gradient of the mean over the global batch's tokens (what one process computes).
Written from https://github.com/huggingface/transformers/issues/34242 ("token averaging in DDP ... does not seem
equivalent to non-parallel training"; fixed by https://github.com/huggingface/transformers/pull/34373,
average_tokens_across_devices).

    torchrun --nproc_per_node=2 token_mean_per_rank.py --steps 100
    gradprobe check_equivalence --script token_mean_per_rank.py --world-size 2 -- --steps 4
"""

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["embed.weight", "head.bias"],
          "line": 58, "args": ["--steps=4"]}
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
    loss = token_sum / (labels != -100).sum()  # this rank's own token count
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
