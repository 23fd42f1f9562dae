"""A script whose own code raises after its first backward, before any optimizer step (a metrics line reads a key its
dict does not have). The gradients of that backward are checked, but the optimizer step never ran: the report is
"partly checked", names the optimizer step as not run with the script's error and line (GP121), and never reads as
OK. Its twin, healthy_twin.py, is verified.

    python raises_after_backward.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
metrics: dict[str, float] = {}
for _step in range(4):
    x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    print("accuracy", metrics["accuracy"])
    optimizer.step()
