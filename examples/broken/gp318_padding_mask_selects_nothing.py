"""A token-tagging head whose loss is multiplied by a mask that is zero everywhere: the mask is built with `==` where
`!=` was meant, so it marks the padding as the positions to drop and, on a batch of padding-only tags, keeps nothing.
The tagging head gets an exactly-zero gradient at every step. GP318 names the multiply, the zero operand and the
line that built the mask.

Written from public threads: open-mmlab/mmpretrain pull #1426 (a task whose samples are all masked out: the loss
became 0 and nothing reached the head) and mila-iqia/blocks issue #952 (`(cost * y_mask).sum()`, how a mask that
multiplies a per-position loss decides which positions train).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP318"], "culprits": ["tok.weight", "tok.bias"], "severity": "warning",
          "line": 46}

PAD = 0


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.cls = nn.Linear(16, 3)
        self.tok = nn.Linear(16, 5)

    def forward(self, x, y=None, tags=None):
        h = torch.relu(self.body(x))
        return self.cls(h.mean(1)), self.tok(h)


def build_model():
    return TwoHeads()


def make_inputs():
    x = torch.randn(4, 7, 6)
    y = torch.randint(0, 3, (4,))
    tags = torch.full((4, 7), PAD)  # the token tags of this data set are all padding
    return x, y, tags


def loss_fn(out, batch):
    logits, tok_logits = out
    _, y, tags = batch
    mask = (tags == PAD).float()  # meant: tags != PAD
    tok = F.cross_entropy(tok_logits.reshape(-1, 5), tags.reshape(-1), reduction="none")
    tok = (tok * (1 - mask.reshape(-1))).sum() / mask.numel()
    return F.cross_entropy(logits, y) + tok
