"""Train PromptedClassifier with Hugging Face accelerate (Accelerator.backward).

    accelerate launch train.py --epochs 1
"""

import argparse

import torch
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from model import PromptedClassifier

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randint(0, 100, (64, 10), generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = PromptedClassifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for epoch in range(args.epochs):
    model.train()
    for ids, y in loader:
        loss = F.cross_entropy(model(ids), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
