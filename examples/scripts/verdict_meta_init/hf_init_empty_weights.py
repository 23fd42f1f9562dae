"""Hugging Face: `accelerate.init_empty_weights()` around `AutoModelForCausalLM.from_config` (a tiny GPT-2 config, no
download), `to_empty()`, the model's own `_init_weights`, its tie, then training on its `.loss`.

    python hf_init_empty_weights.py
"""

import torch
from accelerate import init_empty_weights
from transformers import AutoModelForCausalLM, GPT2Config

config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
with init_empty_weights():
    model = AutoModelForCausalLM.from_config(config)
model.to_empty(device="cpu")
torch.manual_seed(0)
model.apply(model._init_weights)
model.tie_weights()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(4):
    idx = torch.randint(0, 64, (2, 8))
    loss = model(input_ids=idx, labels=idx).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", round(loss.item(), 4))
