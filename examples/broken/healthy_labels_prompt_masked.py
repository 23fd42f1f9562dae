"""Healthy twin of gp318_labels_all_ignored.py: the same tiny causal LM with the prompt masked out of the labels
(-100), but the prompts are shorter than the sequence length, so the answer tokens keep their labels: `logits[keep]`
selects some positions of every batch and every parameter gets a gradient. GP318 says nothing.

Written from the same public threads: allenai/OLMo-core pull #657 (https://github.com/allenai/OLMo-core/pull/657) and
pytorch/pytorch issue #70348 (https://github.com/pytorch/pytorch/issues/70348).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP318", "GP306"]}

VOCAB, MAX_LEN, PROMPT_LEN = 50, 8, 3
IGNORE = -100


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, ids, labels=None):
        return self.head(torch.tanh(self.body(self.emb(ids))))


def build_model():
    return TinyLM()


def make_inputs():
    ids = torch.randint(0, VOCAB, (4, PROMPT_LEN + 4))[:, :MAX_LEN]  # the answer follows the prompt
    labels = ids.clone()
    labels[:, :PROMPT_LEN] = IGNORE  # the prompt is not trained on
    return ids, labels


def loss_fn(logits, batch):
    _, labels = batch
    keep = labels != IGNORE
    return F.cross_entropy(logits[keep], labels[keep], reduction="sum") / keep.sum().clamp(min=1)
