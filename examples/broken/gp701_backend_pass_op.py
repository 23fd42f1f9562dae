"""A custom torch.compile backend whose graph pass runs softmax in bfloat16 "for speed": the compiled attention's
gradients differ from eager beyond tolerance, and the op responsible is found by running the captured graph op by op
in eager against the backend's compiled version (the accuracy minifier's method, pytorch/torchdynamo#1291).

After pytorch/pytorch#182765 (a backend computes one op's gradient differently from eager: aot_eager agrees with
eager, the backend does not) and #183602: the model is right, the backend's version of one op is not.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager

EXPECT = {"tool": "diagnose", "codes": ["GP701"], "culprits": ["query.weight"], "line": 37}


def _softmax_bf16(x, dim=-1, **kwargs):
    return torch.softmax(x.to(torch.bfloat16), dim).to(x.dtype)


def fast_backend(gm, example_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (F.softmax, torch.softmax):
            node.target = _softmax_bf16  # BUG: the "speed" pass changes softmax's precision, and its gradient
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
