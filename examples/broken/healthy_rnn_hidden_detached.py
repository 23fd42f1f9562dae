"""The healthy twin of gp119_hidden_state_not_detached.py: the hidden state is detached before each chunk (truncated
backpropagation through time, pytorch/examples word_language_model's `repackage_hidden`). No error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP119", "GP308"]}


class CharRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.rec = nn.Linear(8, 8)
        self.out = nn.Linear(8, 5)

    def forward(self, x, h):
        h = torch.tanh(self.inp(x) + self.rec(h))
        return self.out(h), h


def build_model():
    return CharRNN()


def make_inputs():
    return torch.randn(3, 4, 5)  # 3 chunks of a batch of 4


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, chunks, optimizer):
    h = torch.zeros(4, 8)
    for x in chunks:
        optimizer.zero_grad()
        y, h = model(x, h.detach())  # truncated BPTT: each chunk backpropagates through its own graph
        loss = y.pow(2).mean()
        loss.backward()
        optimizer.step()
    return loss
