"""Lightning Fabric's `init_module(empty_init=True)` (litgpt's pretrain path), then a flop count on a meta-device copy
of the model (litgpt's `measure_flops`: a forward and backward under FlopCounterMode inside `with torch.device("meta")`),
then training. It runs plainly; under gradprobe the meta backward is no step and the meta device does not leak into the
training loop (a watch gradprobe opened inside the meta block once took the place of torch.device's own mode on exit,
and the script then raised "Tensor on device cpu is not on the expected device meta!").

    python fabric_empty_init.py
"""

import lightning as L
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpt import GPT, batch, loss_of

fabric = L.Fabric(accelerator="cpu", devices=1)
fabric.seed_everything(0)
with fabric.init_module(empty_init=True):
    model = GPT()
model.init_weights()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = fabric.setup(model, optimizer)

with torch.device("meta"):
    meta_model = GPT()
    x = torch.randint(0, 1, (4, 9))
    with FlopCounterMode(display=False) as counter:
        loss_of(meta_model, x).backward()
print("flops per step", counter.get_total_flops())

for _step in range(4):
    loss = loss_of(model, batch())
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
print("trained", round(loss.item(), 4))
