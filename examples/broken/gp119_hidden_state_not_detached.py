"""A character RNN trained over consecutive chunks of one sequence, whose hidden state is carried from one chunk into the
next without `.detach()`: the second chunk's backward() runs into the first chunk's graph, already freed, and torch raises
"Trying to backward through the graph a second time", suggesting retain_graph=True (which would grow the graph without
bound). The finding names the carried tensor's op and line, measured on the two graphs.

Written from the public threads on this error: discuss.pytorch.org "Trying to backward through the graph a second time,
but the buffers have already been freed" (https://discuss.pytorch.org/t/runtimeerror-trying-to-backward-through-the-graph-a-second-time-but-the-buffers-have-already-been-freed-specify-retain-graph-true-when-calling-backward-the-first-time/6795)
and the truncated-BPTT answer to it: detach the hidden state before each chunk (as pytorch/examples word_language_model's
`repackage_hidden` does).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP119"], "culprits": [], "line": 25}


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
        y, h = model(x, h)  # h keeps the previous chunk's graph
        loss = y.pow(2).mean()
        loss.backward()
        optimizer.step()
    return loss
