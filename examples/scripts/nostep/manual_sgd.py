"""A loop without a torch optimizer: updates by hand after backward (the first backward is the step)."""

import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
for step in range(5):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    loss = nn.functional.mse_loss(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
