"""A tiny causal LM fine-tuned on prompt/answer pairs, with the prompt masked out of the labels (-100, the
ignore index). Every prompt of this data set is longer than the sequence length it is truncated to, so nothing of the
answer is left: every label is -100, `logits[keep]` selects 0 of the 32 positions, and the whole model gets an
exactly-zero gradient at every step (a loss of 0 that trains nothing). GP318 (`empty_index`) names the selection, the
count it selected (0 of 32) and the line that made the mask.

Written from public threads: allenai/OLMo-core pull #657 (https://github.com/allenai/OLMo-core/pull/657: "some ranks
may receive batches where all labels are label_ignore_index (-100)"; `(labels != label_ignore_index).sum()` is 0) and
pytorch/pytorch issue #70348 (https://github.com/pytorch/pytorch/issues/70348: cross-entropy when all the labels are
the ignore index).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP318"], "culprits": ["emb.weight", "body.weight", "head.weight"],
          "severity": "warning", "line": 47}

VOCAB, MAX_LEN, PROMPT_LEN = 50, 8, 10
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
    ids = torch.randint(0, VOCAB, (4, PROMPT_LEN + 4))[:, :MAX_LEN]  # truncation keeps only the prompt
    labels = ids.clone()
    labels[:, :PROMPT_LEN] = IGNORE  # the prompt is not trained on
    return ids, labels


def loss_fn(logits, batch):
    _, labels = batch
    keep = labels != IGNORE
    return F.cross_entropy(logits[keep], labels[keep], reduction="sum") / keep.sum().clamp(min=1)
