"""Healthy twin of gp903_packing_all_ones_mask.py: the same packed batch (DataCollatorWithFlattening, position_ids
that restart), the wrapper passes no attention_mask and use_cache=False, so transformers builds a block-diagonal mask:
each packed example sees only itself (measured), and the packed loss and gradients equal those of the same examples
padded one per row."""
import torch
import torch.nn as nn
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

EXPECT = {"tool": "check_dependencies", "codes": [], "culprits": [], "healthy": True,
          "absent": ["GP901", "GP902", "GP903", "GP803"]}


class PackedLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lm = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))

    def forward(self, input_ids, position_ids, labels):
        return self.lm(input_ids=input_ids, position_ids=position_ids, labels=labels, use_cache=False)


def build_model():
    return PackedLM()


def make_inputs():
    examples = [{"input_ids": torch.randint(0, 96, (n,)).tolist()} for n in (5, 7, 4)]
    return DataCollatorWithFlattening(return_tensors="pt")(examples)
