"""Knowledge distillation with a hint (FitNets), written the way the PyTorch knowledge-distillation tutorial writes it:
a teacher network used under no_grad as the target (in eval mode, never frozen with requires_grad_(False)), a smaller
student, and a regressor that maps the student's hidden features to the teacher's, all three held apart. One SGD with
two parameter groups trains the student and the regressor; the loss is cross-entropy, the soft-target KL term and the
hint's mean squared error. Healthy: the student and the regressor move at every step, the teacher stays as it was.

Written from pytorch/tutorials pull request #2514 (https://github.com/pytorch/tutorials/pull/2514, "Add
knowledge_distillation_tutorial": the teacher's outputs under torch.no_grad(), and a regressor between the student's
and the teacher's feature maps that "will be trainable"). The healthy twin of several_distill_regressor_left_out.

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
optimizer = torch.optim.SGD([{"params": student.parameters()}, {"params": regressor.parameters(), "lr": 0.05}],
                            lr=0.1, momentum=0.9)
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
