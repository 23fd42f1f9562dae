"""Built on the meta device, materialised with `to_empty()`, each module's `reset_parameters()` (PyTorch's documented
deferred init), the flop count done on the meta model before any optimizer exists (a meta backward is no step).

    python meta_to_empty.py
"""

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpt import GPT, batch, loss_of

torch.manual_seed(0)
with torch.device("meta"):
    model = GPT()
    with FlopCounterMode(display=False) as counter:
        loss_of(model, torch.randint(0, 1, (4, 9))).backward()
print("flops per step", counter.get_total_flops())
model.to_empty(device="cpu")
for m in model.modules():
    if hasattr(m, "reset_parameters"):
        m.reset_parameters()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(4):
    loss = loss_of(model, batch())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", round(loss.item(), 4))
