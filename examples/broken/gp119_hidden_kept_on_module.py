"""A stateful RNN that keeps its hidden state on the module between batches (`self.hidden = ...` in forward) without
detaching it: the first training step works, the second one's backward() runs into the first step's freed graph and
torch raises "Trying to backward through the graph a second time". One traced step does not show it; the model holds a
tensor of the backwarded graph after it, so the step is run a second time, which raises: the finding names the
attribute, the op and the line that keeps the graph.

Written from the discuss.pytorch.org thread "Trying to backward through the graph a second time, but the buffers have
already been freed" (https://discuss.pytorch.org/t/runtimeerror-trying-to-backward-through-the-graph-a-second-time-but-the-buffers-have-already-been-freed-specify-retain-graph-true-when-calling-backward-the-first-time/6795)
and pytorch/examples word_language_model's `repackage_hidden` (the hidden state detached before each batch).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": ["GP119"], "culprits": [], "line": 27}


class StatefulRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.init = nn.Linear(5, 8)  # the first batch's state, from its input
        self.cell = nn.RNNCell(5, 8)
        self.head = nn.Linear(8, 1)
        self.hidden = None

    def forward(self, x):
        h = self.hidden if self.hidden is not None else torch.tanh(self.init(x))
        self.hidden = self.cell(x, h)  # kept for the next batch, with its graph
        return self.head(self.hidden)


def build_model():
    return StatefulRNN()


def make_inputs():
    return torch.randn(4, 5)


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss
