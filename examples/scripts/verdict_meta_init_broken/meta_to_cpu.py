"""Built on the meta device and moved with `.to("cpu")` instead of `to_empty()`: the script itself raises
"Cannot copy out of meta tensor; no data!" (https://github.com/Lightning-AI/litgpt/issues/1378), plainly as under
gradprobe. That is the script's own error (GP112 at its line), not a check of gradprobe's that did not run: the healthy
twins are in verdict_meta_init (to_empty, then an init).

    python meta_to_cpu.py
"""

import torch

from gpt import GPT, batch, loss_of

torch.manual_seed(0)
with torch.device("meta"):
    model = GPT()
model = model.to("cpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(4):
    loss = loss_of(model, batch())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", round(loss.item(), 4))
