"""Healthy, compiled: a trainable offset added to frozen prompt embeddings, projected back into a small ball at the
start of every forward by assigning its `.data` (the structure of PEFT's context-aware prompt tuning, CPTEmbedding:
`self.delta_embedding.weight.data = self.get_projection()`).

Under torch.compile dynamo captures the `.data` assignment as a `set_` on the parameter (pytorch/pytorch#139152,
https://github.com/pytorch/pytorch/issues/139152). The compiled graph then holds the offset's gradient accumulator from
before the assignment, not the one the parameter has afterwards: `loss.backward()` still fills `delta.weight.grad`
exactly as eager does, but `torch.autograd.grad(loss, [delta.weight])` returns None. gradprobe compares compiled with
eager by what backward accumulates, so this model must stay clean (it used to get a false GP701 `unread`).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP701"]}


class ProjectedPrompt(nn.Module):
    def __init__(self, tokens=4, d=16, eps=0.5):
        super().__init__()
        self.prompt = nn.Embedding(tokens, d)
        self.prompt.requires_grad_(False)  # frozen: initialised from the vocabulary, only the offset trains
        self.delta = nn.Embedding(tokens, d)
        self.delta.weight.data.zero_()
        self.eps = eps

    def forward(self, idx):
        with torch.no_grad():
            base = self.prompt(idx)
            projected = self.delta.weight.clamp(-self.eps, self.eps)
        self.delta.weight.data = projected  # keep the offset within eps of the prompt (a projection step)
        return base + self.delta(idx)


class Classifier(nn.Module):
    def __init__(self, tokens=4, d=16, classes=3):
        super().__init__()
        self.prompt = ProjectedPrompt(tokens, d)
        self.encoder = nn.Linear(d, d)
        self.head = nn.Linear(d, classes)
        self.register_buffer("slots", torch.arange(tokens))

    def forward(self, x):
        prompt = self.prompt(self.slots).unsqueeze(0).expand(x.shape[0], -1, -1)
        h = torch.tanh(self.encoder(torch.cat([prompt, x], dim=1)))
        return self.head(h.mean(dim=1))


def build_model():
    return torch.compile(Classifier(), backend="aot_eager")


def make_inputs():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(8, 5, 16, generator=g), "labels": torch.randint(0, 3, (8,), generator=g)}


def loss_fn(logits, batch):
    return F.cross_entropy(logits, batch["labels"])


def make_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
