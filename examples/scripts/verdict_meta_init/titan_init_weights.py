"""torchtitan-style init: the model built on the meta device, `to_empty()` on the training device, then the model's own
`init_weights()` under no_grad, then the optimizer.

    python titan_init_weights.py
"""

import torch

from gpt import GPT, batch, loss_of

torch.manual_seed(0)
with torch.device("meta"):
    model = GPT()
model.to_empty(device="cpu")
with torch.no_grad():
    model.init_weights()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(4):
    loss = loss_of(model, batch())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", round(loss.item(), 4))
