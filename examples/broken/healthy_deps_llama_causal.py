"""Healthy twin of gp901_decoder_is_causal_false.py: the same tiny Llama from its config, causal (the default), trained
as a causal LM with padding in one row. Measured causal at the sampled positions, examples independent."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True, "absent": ["GP901", "GP902", "GP903"]}


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def make_inputs():
    input_ids = torch.randint(0, 96, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "labels": input_ids.masked_fill(attention_mask == 0, -100)}
