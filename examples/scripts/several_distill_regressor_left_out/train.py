"""The distillation loop of several_distill with one bug: the optimizer is built from the student's parameters only,
so the regressor that maps the student's hidden features to the teacher's gets a gradient at every step and never
moves: the hint term then pulls the student toward a fixed random projection of the teacher's features, and nothing
raises.

Written from AberHu/Knowledge-Distillation-Zoo issue #7 (https://github.com/AberHu/Knowledge-Distillation-Zoo/issues/7,
"Question on FitNet (Hint)": how the hint module between the student and the teacher gets trained; it is a module of
its own, outside the student, and learns only if an optimizer holds it).

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--T", type=float, default=2.0)
args = parser.parse_args()
torch.manual_seed(0)


class Net(nn.Module):
    """An MLP that returns its hidden features and its logits."""

    def __init__(self, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 5)

    def forward(self, x):
        features = self.body(x)
        return features, self.head(features)


teacher = Net(hidden=32)  # "pretrained": trained before this script, used as it is
student = Net(hidden=8)
regressor = nn.Linear(8, 32)  # the student's hidden features, in the teacher's width
optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
teacher.eval()

for _step in range(args.steps):
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    with torch.no_grad():
        teacher_features, teacher_logits = teacher(x)
    student_features, student_logits = student(x)
    soft = F.kl_div(F.log_softmax(student_logits / args.T, -1), F.softmax(teacher_logits / args.T, -1),
                    reduction="batchmean") * args.T ** 2
    hint = F.mse_loss(regressor(student_features), teacher_features)
    loss = F.cross_entropy(student_logits, y) + soft + hint
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
