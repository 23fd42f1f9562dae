"""Healthy twin of deps_packed_loop_broken: the same padding-free loop (DataCollatorWithFlattening, position_ids that
restart), with the model called as `model(**batch, use_cache=False)`: transformers builds its block-diagonal mask and
each packed example sees only itself (measured); the packed loss and gradients equal the padded ones.

    python train.py --steps=2
"""

import argparse

import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

torch.manual_seed(0)
config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config)
texts = [{"input_ids": torch.randint(0, 96, (int(n),)).tolist()} for n in torch.randint(4, 9, (32,))]
loader = DataLoader(texts, batch_size=3, collate_fn=DataCollatorWithFlattening(return_tensors="pt"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

model.train()
for step, batch in enumerate(loader):
    out = model(**batch, use_cache=False)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step + 1 >= args.steps:
        break
