"""An accelerate loop that evaluates at the start of each epoch with model.eval() and never sets train mode back:
dropout is off for all of training.

Public reports: https://github.com/pytorch/tutorials/issues/1624 ("In the second epoch, the layers are still in
evaluation mode, and train() is called") and https://github.com/tk-rusch/coRNN/issues/1 ("model.train() isn't called
again after model.eval()").

    accelerate launch gp610_eval_leaves_eval_mode.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP610"], "culprits": [], "line": 27, "severity": "warning",
          "args": ["--epochs=1"], "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
held_x, held_y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
for epoch in range(args.epochs):
    accelerator.print(f"epoch {epoch}: accuracy before it {evaluate(model, held_x, held_y):.2f}")
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
