"""Healthy: a tiny GPT-2 from its config, trained as a causal LM (labels = input_ids). Measured causal, examples
independent; dropout (GPT-2 has it everywhere) is off during the probe."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP901", "GP902"]}


def build_model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))


def make_inputs():
    input_ids = torch.randint(0, 96, (3, 10))
    return {"input_ids": input_ids, "labels": input_ids}
