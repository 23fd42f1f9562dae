"""A text classifier with a P-tuning style prompt: prompt vectors made by a small MLP from
learned embeddings, prepended to the token embeddings."""

import torch
import torch.nn as nn


class PromptedClassifier(nn.Module):
    def __init__(self, vocab=100, d=32, n_prompt=4, n_classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.prompt_emb = nn.Parameter(torch.randn(n_prompt, d) * 0.02)
        self.prompt_mlp = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d))
        layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=64, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1)
        self.head = nn.Linear(d, n_classes)

    @torch.no_grad()  # meant for inference only, but forward uses it too
    def make_prompt(self):
        return self.prompt_mlp(self.prompt_emb)

    def forward(self, ids):
        prompt = self.make_prompt()
        x = torch.cat([prompt.unsqueeze(0).expand(ids.size(0), -1, -1), self.embed(ids)], dim=1)
        return self.head(self.encoder(x).mean(dim=1))
