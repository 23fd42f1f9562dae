"""An accelerate loop that never clears gradients: every step adds all earlier steps' gradients to its own.

Public reports: https://github.com/tenstorrent/tt-blacksmith/pull/711 ("we forgot to do zero_grad on optimizer after
each optimizer step") and https://github.com/huggingface/accelerate/issues/2341 (an accelerate loop training worse
than its plain twin because of how it cleared its gradients).

    accelerate launch gp602_zero_grad_never_called.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP602"], "culprits": [], "line": 34, "args": ["--epochs=1"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _epoch in range(args.epochs):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
