"""Healthy: a tiny BERT trained as a masked LM. Its labels are the tokens at the masked positions themselves, not the
next ones, so it claims no causality (bidirectional by design): only example independence is measured."""
import torch
from transformers import BertConfig, BertForMaskedLM

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP901", "GP902"]}

MASK = 4


def build_model():
    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64))


def make_inputs():
    tokens = torch.randint(5, 96, (3, 12))
    masked = torch.rand(tokens.shape) < 0.3
    masked[:, 2] = True
    return {"input_ids": tokens.masked_fill(masked, MASK), "attention_mask": torch.ones_like(tokens),
            "labels": tokens.masked_fill(~masked, -100)}
