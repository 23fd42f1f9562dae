"""The healthy twin of codes_accelerate_broken/gp601, gp602, gp604, gp609 and gp610, in one accelerate loop:
accelerator.accumulate() over 2 batches (accelerate divides the loss and clears the gradients only when the optimizer
steps), the prepared scheduler stepped after the optimizer, a mean teacher moved in place by its EMA after each step,
and an evaluation at the start of each epoch followed by model.train().

Written from https://github.com/huggingface/accelerate/issues/1299 (where zero_grad() goes when accumulating),
https://github.com/huggingface/diffusers/issues/1895 (an EMA that must move under accelerate) and
https://github.com/pytorch/tutorials/issues/1624 (train mode after an evaluation).

    accelerate launch accumulate_ema_eval.py --epochs 3
"""

import argparse
import copy

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "args": ["--epochs=1"], "options": {"steps": 3},
          "absent": ["GP601", "GP602", "GP604", "GP605", "GP609", "GP610", "GP612"]}
DECAY = 0.9
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()


class MeanTeacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
        self.ema_teacher = copy.deepcopy(self.student).requires_grad_(False)

    def forward(self, x):
        return self.student(x), self.ema_teacher(x)


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x)[0].argmax(-1) == y).float().mean().item()
    model.train()
    return accuracy


accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(96, 12, generator=g), torch.randint(0, 3, (96,), generator=g))
loader = DataLoader(data, batch_size=8)
held_x, held_y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
model = MeanTeacher()
optimizer = torch.optim.AdamW(model.student.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 100))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
net = accelerator.unwrap_model(model)
for epoch in range(args.epochs):
    accelerator.print(f"epoch {epoch}: accuracy before it {evaluate(model, held_x, held_y):.2f}")
    for x, y in loader:
        with accelerator.accumulate(model):
            student, teacher = model(x)
            loss = F.cross_entropy(student, y) + F.mse_loss(student.softmax(-1), teacher.softmax(-1))
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            with torch.no_grad():
                for e, p in zip(net.ema_teacher.parameters(), net.student.parameters(), strict=True):
                    e.lerp_(p, 1 - DECAY)
