"""The healthy twin of gp119_hidden_kept_on_module.py: the hidden state kept on the module is detached (pytorch/examples
word_language_model's `repackage_hidden`). No error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP119", "GP308"]}


class StatefulRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.init = nn.Linear(5, 8)  # the first batch's state, from its input
        self.cell = nn.RNNCell(5, 8)
        self.head = nn.Linear(8, 1)
        self.hidden = None

    def forward(self, x):
        h = self.hidden if self.hidden is not None else torch.tanh(self.init(x))
        out = self.cell(x, h)
        self.hidden = out.detach()  # kept for the next batch without its graph (repackage_hidden)
        return self.head(out)


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
