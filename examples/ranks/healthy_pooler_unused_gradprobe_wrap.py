"""A healthy encoder whose pooler is unused by design (a masked-LM loss reads the token states only, as in a BERT
pretrained for masked LM, whose unused pooler DDP users meet as "Expected to have finished reduction in the prior
iteration": https://github.com/princeton-nlp/SimCSE/pull/78, and transformers' EncoderDecoderModel in
https://github.com/huggingface/transformers/issues/7924), given as a plain model at world size 2. gradprobe wraps it
in DistributedDataParallel with its defaults (find_unused_parameters=False): the pooler, without a gradient on every
rank, stalls its bucket, so that bucket's gradients are not averaged. That is true of the wrap gradprobe chose, not
of this code: GP704 `ddp_stalled_by_gradprobe` is an info that says what a wrap of this model needs
(find_unused_parameters=True, as transformers' Trainer passes, or freezing the pooler), and no error is reported.

    gradprobe diagnose examples/ranks/healthy_pooler_unused_gradprobe_wrap.py --world-size 2
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "world_size": 2, "healthy": True, "wrapped": "by gradprobe", "codes": ["GP704"],
          "culprits": ["pooler.weight"], "severity": "info", "absent": ["GP703", "GP706", "GP707"]}

VOCAB, D = 40, 16


class TinyMaskedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.encoder = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, D))
        self.pooler = nn.Linear(D, D)  # for a sequence-level head; the masked-LM loss does not use it
        self.lm_head = nn.Linear(D, VOCAB)

    def forward(self, input_ids):
        h = self.encoder(self.embed(input_ids))
        return self.lm_head(h)


def build_model():
    return TinyMaskedLM()


def make_inputs():
    ids = torch.randint(0, VOCAB, (4, 6))
    return {"input_ids": ids, "labels": torch.randint(0, VOCAB, (4, 6))}


def loss_fn(logits, batch):
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1))


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
