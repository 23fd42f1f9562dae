"""Padding-free fine-tuning of a small Llama in a plain loop: transformers' DataCollatorWithFlattening packs each
batch into one row with position_ids that restart, and the model is called as `model(**batch)`. The model's
configuration keeps use_cache=True (its default outside the Trainer), so a KV cache is built for the training forward
and transformers' packed-sequence mask is off: every packed example attends to the ones before it
(huggingface/transformers#25452 packing without cross-contamination; PR #46634: the packed mask is only built without
a cache and without a 2-D mask; huggingface/trl#784).

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
    out = model(**batch)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step + 1 >= args.steps:
        break
