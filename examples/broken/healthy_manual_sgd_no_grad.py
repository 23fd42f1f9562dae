"""The healthy twin of gp118_manual_sgd_update.py: the hand-written SGD update runs under `torch.no_grad()`
(pytorch/examples pull request #779). No error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP118", "GP100"]}


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
    with torch.no_grad():  # the update is not part of the graph (pytorch/examples #779 used p.data)
        for p in model.parameters():
            p.add_(-0.1 * p.grad)
    return loss
