"""A hand-written SGD update after backward(), `p.add_(-lr * p.grad)` on each parameter, outside `torch.no_grad()`:
torch refuses with "a leaf Variable that requires grad is being used in an in-place operation". The finding names the
first parameter the update touched, the line, and the `no_grad` form.

Written from pytorch/examples pull request #779 (https://github.com/pytorch/examples/pull/779: "`p.add_(-lr, p.grad)`
throws RuntimeError: a leaf Variable that requires grad is being used in an in-place operation", in the
word_language_model's manual update).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP118"], "culprits": ["encoder.weight"], "line": 39}


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(20, 8)
        self.decoder = nn.Linear(8, 20)

    def forward(self, tokens):
        return self.decoder(self.encoder(tokens))


def build_model():
    return TinyLM()


def make_inputs():
    return torch.randint(0, 20, (4, 6)), torch.randint(0, 20, (4, 6))


def train_step(model, batch, optimizer):
    tokens, targets = batch
    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.add_(-0.1 * p.grad)
    return loss
