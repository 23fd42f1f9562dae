"""A mean-teacher loop whose EMA update rebinds a loop variable: the teacher never moves.

Written from https://github.com/CuriousAI/mean-teacher/issues/28 ("the teacher model's weights seem to be not
updated as it performed as bad as it was first initialized"): an EMA update that does not write into the teacher's
tensors leaves it at its initial weights, and nothing raises.

    python train.py --steps 100
"""

import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--decay", type=float, default=0.9)
args = parser.parse_args()
torch.manual_seed(0)


class MeanTeacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.ema_teacher = copy.deepcopy(self.student)

    def forward(self, x):
        with torch.no_grad():
            target = self.ema_teacher(x)
        return self.student(x), target


def update_teacher(model, decay):
    with torch.no_grad():
        for pt, ps in zip(model.ema_teacher.parameters(), model.student.parameters(), strict=True):
            pt = decay * pt + (1 - decay) * ps  # rebinds the name: the teacher's tensor is untouched


model = MeanTeacher()
optimizer = torch.optim.SGD(model.student.parameters(), lr=0.1)
for _step in range(args.steps):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    logits, target = model(x)
    loss = F.cross_entropy(logits, y) + F.mse_loss(logits.softmax(-1), target.softmax(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    update_teacher(model, args.decay)
