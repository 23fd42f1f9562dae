"""An accelerate loop with gradient accumulation whose loss is divided by the accumulation steps by the script too:
`accelerator.backward()` already divides by `gradient_accumulation_steps`, so each step gets 1/4 of the batch's mean
gradient.

Written from the public reports https://github.com/huggingface/accelerate/issues/3533 ("double divide
gradient_accumulation_steps") and https://github.com/huggingface/accelerate/issues/1773 (the loss divided before
accelerator.backward()). Nothing raises.

    accelerate launch train.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
ACCUM = 4

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(256, 12, generator=g), torch.randint(0, 3, (256,), generator=g))
loader = DataLoader(data, batch_size=4, shuffle=True)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for epoch in range(args.epochs):
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y) / ACCUM  # accelerator.backward divides by ACCUM too
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
