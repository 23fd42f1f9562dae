"""Its loop fails before the first step and the error is caught and ignored."""

import torch
import torch.nn as nn

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for _ in range(3):
        x = torch.randn(8, 5)  # wrong width: the forward fails
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
except Exception as exc:
    print("training failed, carrying on:", exc)
print("done")
