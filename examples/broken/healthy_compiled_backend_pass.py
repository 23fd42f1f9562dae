"""A healthy twin of gp701_backend_pass_op.py: the custom backend's graph pass rewrites softmax into the same
computation in the input's own precision (a max-subtracted exp over its sum), so the compiled attention's gradients
match eager's within tolerance.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP701"]}


def _softmax_exact(x, dim=-1, **kwargs):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def fast_backend(gm, example_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (F.softmax, torch.softmax):
            node.target = _softmax_exact
    gm.recompile()
    return aot_eager(gm, example_inputs)


class Attention(nn.Module):
    def __init__(self, d=16, classes=4):
        super().__init__()
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        scores = self.query(x) @ self.key(x).transpose(-1, -2) / 4.0
        weights = F.softmax(scores, dim=-1)
        return self.head((weights @ x).mean(dim=1))


def build_model():
    torch.manual_seed(0)
    return torch.compile(Attention(), backend=fast_backend)


def make_inputs():
    return {"x": torch.randn(4, 6, 16), "labels": torch.randint(0, 4, (4,))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
