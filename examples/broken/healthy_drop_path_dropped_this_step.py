"""Healthy twin of gp318_padding_mask_selects_nothing.py: stochastic depth (drop path, as in timm's `drop_path` and
transformers' SegFormer/ConvNeXt/Swin `*DropPath`). The residual branch is multiplied by a per-sample mask
`floor(keep_prob + rand)`; when the draw drops the branch for every sample of the batch, its parameters get an
exactly-zero gradient at that step, by design: the next draw keeps it. A mask drawn at random is not a cause, so GP318
says so as information, never as a warning (the drop rate here is extreme so that the draw drops the whole batch at the checked step).

Written from the ecosystem sweep's one new-code warning this round (SegFormer's `SegformerDropPath` dropped one block
for both samples of a batch) and from the public discussion of drop path zeroing whole samples:
huggingface/pytorch-image-models issue #1120 ("DropPath ... the output of some samples are all zeros").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP318"], "culprits": ["block.mlp.0.weight", "block.mlp.0.bias",
                                                       "block.mlp.2.weight", "block.mlp.2.bias"],
          "severity": "info", "healthy": True}


def drop_path(x, drop_prob, training):
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device)
    random_tensor.floor_()  # binarize: 1 keeps the sample's branch, 0 drops it
    return x.div(keep_prob) * random_tensor


class Block(nn.Module):
    def __init__(self, width, drop_prob):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.drop_prob = drop_prob

    def forward(self, x):
        return x + drop_path(self.mlp(x), self.drop_prob, self.training)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.block = Block(16, drop_prob=0.999)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.block(self.inp(x)))


def build_model():
    return Net()


def make_inputs():
    return torch.randn(2, 6)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss_fn(out, x):
    return F.mse_loss(out, torch.zeros_like(out))
