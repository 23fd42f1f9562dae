"""The twin of replay_needs_loop_state.py and raises_after_backward.py: the mask is an argument of the forward and the
loop reaches its optimizer step, so every check that applies runs and the report is "verified".

    python healthy_twin.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens)) * pad_mask.unsqueeze(-1)


torch.manual_seed(0)
model = Tagger()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(4):
    tokens = torch.randint(0, 20, (3, 7))
    logits = model(tokens, (tokens != 0).float())
    loss = F.cross_entropy(logits.flatten(0, 1), torch.randint(0, 4, (21,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", round(loss.item(), 4))
