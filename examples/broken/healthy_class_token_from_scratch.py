"""Healthy: a text classifier trained whole from scratch that prepends a learned class token to its token embeddings
(the BERT/ViT [CLS] pattern). The token is joined to the sequence like a soft prompt, but nothing here is frozen: it is
part of the model, not a prompt tuned beside a frozen base, so no prompt-tuning finding (GP503 "base not frozen") applies.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "codes": [], "culprits": [], "healthy": True, "absent": ["GP501", "GP503", "GP508"]}


class ClassTokenClassifier(nn.Module):
    def __init__(self, vocab=100, d=32, n_classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.prompt_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=64, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1)
        self.head = nn.Linear(d, n_classes)

    def forward(self, ids):
        x = torch.cat([self.prompt_token.expand(ids.size(0), -1, -1), self.embed(ids)], dim=1)
        return self.head(self.encoder(x)[:, 0])


def build_model():
    return ClassTokenClassifier()


def make_inputs():
    return {"ids": torch.randint(0, 100, (4, 12)), "y": torch.randint(0, 3, (4,))}


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, batch, optimizer):
    loss = F.cross_entropy(model(batch["ids"]), batch["y"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
