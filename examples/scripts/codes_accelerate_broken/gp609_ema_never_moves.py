"""An accelerate loop whose mean-teacher EMA copy never moves: the update rebinds the loop variable instead of writing
into the teacher's tensors, so the teacher stays at its initial weights while the student trains.

Public report: https://github.com/huggingface/diffusers/issues/1895 ("EMA model is not updated properly" when
trained through accelerate: "the EMAModel is not updated while it works without accelerate").

    accelerate launch gp609_ema_never_moves.py --epochs 1
"""

import argparse
import copy

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP609"], "culprits": ["ema_teacher.0.weight"], "line": 31,
          "severity": "error", "args": ["--epochs=1"], "options": {"steps": 3}}
DECAY = 0.9
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()


class MeanTeacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
        self.ema_teacher = copy.deepcopy(self.student).requires_grad_(False)

    def forward(self, x):
        return self.student(x), self.ema_teacher(x)


accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
model = MeanTeacher()
optimizer = torch.optim.AdamW(model.student.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
net = accelerator.unwrap_model(model)
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        student, teacher = model(x)
        loss = F.cross_entropy(student, y) + F.mse_loss(student.softmax(-1), teacher.softmax(-1))
        accelerator.backward(loss)
        optimizer.step()
        with torch.no_grad():
            for e, p in zip(net.ema_teacher.parameters(), net.student.parameters(), strict=True):
                e = DECAY * e + (1 - DECAY) * p  # the bug: rebinds e, the teacher never changes
