"""A Llama decoder trained as a causal LM (labels = input_ids, shifted inside the model) with a configuration copied
from a bidirectional embedding model: `is_causal=False` turns the decoder's causal mask off in current transformers
(huggingface/transformers#43705 made the flag a config attribute of every model; #46077, #27819: a decoder's causal
mask that is not where it should be), so every position sees the tokens it is trained to predict."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "check_dependencies", "codes": ["GP901"], "culprits": ["is_causal"], "line": 17}

EMBEDDING_MODEL_CONFIG = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, is_causal=False)


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(**EMBEDDING_MODEL_CONFIG)
    return LlamaForCausalLM(config)


def make_inputs():
    input_ids = torch.randint(0, 96, (2, 12))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids}
