"""A context-length crop (a smaller position table) called after the optimizer was built: the optimizer
keeps the old table, the model trains with the new one, which never moves."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP202", "GP201"], "culprits": ["pos.weight"], "line": 41}


class TinyLM(nn.Module):
    def __init__(self, vocab=20, dim=8, max_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.out = nn.Linear(dim, vocab)

    def shrink_context(self, max_len):
        self.pos.weight = nn.Parameter(self.pos.weight[:max_len].detach().clone())

    def forward(self, idx):
        t = torch.arange(idx.size(1))
        return self.out(self.tok(idx) + self.pos(t))


def build_model():
    return TinyLM()


def make_inputs():
    data = torch.randint(0, 20, (4, 9))
    return {"x": data[:, :-1], "y": data[:, 1:]}


def loss_fn(logits, batch):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["y"].reshape(-1))


def make_optimizer(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # the fine-tuning data is short: crop the position table
    model.shrink_context(16)
    return optimizer


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    loss = loss_fn(model(batch["x"]), batch)
    loss.backward()
    optimizer.step()
    return loss.item()
