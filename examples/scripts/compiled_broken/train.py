"""A compiled training script whose model applies its learned temperature on the eager path only (a branch on
torch.compiler.is_compiling() meant for logging), so under torch.compile the temperature gets no gradient.
After huggingface/transformers#48975 (a branch on what torch.compiler reports computes something else compiled)."""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

torch.manual_seed(0)


class Scorer(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 32), nn.GELU())
        self.head = nn.Linear(32, 1)
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        score = self.head(self.body(x)).squeeze(-1)
        if not torch.compiler.is_compiling():  # BUG: meant for logging only, it also holds the temperature
            self.last_score_norm = float(score.detach().norm())
            score = score / self.temperature
        return score


model = torch.compile(Scorer(), backend="aot_eager")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
