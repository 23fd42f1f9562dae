"""Padding-free training: transformers' DataCollatorWithFlattening packs the examples into one row with position_ids
that restart, and the model wrapper passes an all-ones attention_mask along. A 2-D mask turns transformers'
packed-sequence detection off, so every packed example attends to the ones before it (huggingface/transformers#25452
"Packing without cross-contamination", PR #46634: the packed mask is ignored when a 2-D attention_mask is passed;
huggingface/trl#784)."""
import torch
import torch.nn as nn
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "check_dependencies", "codes": ["GP903", "GP803"], "culprits": ["attention_mask"], "line": 22}


class PackedLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lm = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))

    def forward(self, input_ids, position_ids, labels):
        mask = torch.ones_like(input_ids)
        return self.lm(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, labels=labels,
                       use_cache=False)


def build_model():
    return PackedLM()


def make_inputs():
    examples = [{"input_ids": torch.randint(0, 96, (n,)).tolist()} for n in (5, 7, 4)]
    return DataCollatorWithFlattening(return_tensors="pt")(examples)
