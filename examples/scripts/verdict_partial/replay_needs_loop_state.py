"""A forward that reads state the training loop sets on the model around each call (a padding mask put on the module
before the forward and taken off after the backward): the script trains, but gradprobe's replay of its step, after
the loop took the mask off, raises. That is gradprobe's limitation, never the script's error: the checks that needed
the replay did not run, the report is "partly checked" and says so first (GP121, cause gradprobe), with what the
script's own step still verified. Its twin, healthy_twin.py, passes the mask as an argument and is verified.

    python replay_needs_loop_state.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens)) * self.pad_mask.unsqueeze(-1)  # set by the loop, not an argument


torch.manual_seed(0)
model = Tagger()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(4):
    tokens = torch.randint(0, 20, (3, 7))
    model.pad_mask = (tokens != 0).float()
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), torch.randint(0, 4, (21,)))
    optimizer.zero_grad()
    loss.backward()
    del model.pad_mask
    optimizer.step()
print("trained", round(loss.item(), 4))
