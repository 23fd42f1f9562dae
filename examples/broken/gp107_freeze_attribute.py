"""Freezing the embedding with an attribute instead of requires_grad_(False): it keeps training."""
import torch
import torch.nn as nn

EXPECT = {"tool": "inspect_parameters", "codes": ["GP107"], "culprits": ["embed.weight"], "line": 21}


class BagClassifier(nn.Module):
    def __init__(self, vocab=50, d=8):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, d)
        self.out = nn.Linear(d, 2)

    def forward(self, ids):
        return self.out(self.embed(ids))


def build_model():
    model = BagClassifier()
    # keep the pretrained embedding fixed
    model.embed.requires_grad = False
    return model


def make_inputs():
    return torch.randint(0, 50, (4, 6))
