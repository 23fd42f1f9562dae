"""The Hugging Face Trainer with a mean teacher whose EMA callback (on_step_end) rebinds the loop variable instead of
writing into the teacher's tensors: the teacher stays at its initial weights while the student trains.

Public report: https://github.com/huggingface/diffusers/issues/1895 ("EMA model is not updated properly": "the
EMAModel is not updated" under one training setup while it works under another).

    python gp609_ema_callback_never_moves.py --max_steps 100
"""

import argparse
import copy

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": ["GP609"], "culprits": ["ema_teacher.0.weight"], "line": 44,
          "severity": "error", "args": ["--max_steps=8"], "options": {"steps": 3}}
DECAY = 0.9
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class Points(Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class MeanTeacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.ema_teacher = copy.deepcopy(self.student).requires_grad_(False)

    def forward(self, x, labels=None):
        student, teacher = self.student(x), self.ema_teacher(x)
        loss = F.cross_entropy(student, labels) + F.mse_loss(student.softmax(-1), teacher.softmax(-1))
        return {"loss": loss, "logits": student}


class EmaCallback(TrainerCallback):
    def __init__(self, net):
        self.net = net

    def on_step_end(self, args, state, control, **kwargs):
        with torch.no_grad():
            for e, p in zip(self.net.ema_teacher.parameters(), self.net.student.parameters(), strict=True):
                e = DECAY * e + (1 - DECAY) * p  # the bug: rebinds e, the teacher never changes


model = MeanTeacher()
optimizer = torch.optim.AdamW(model.student.parameters(), lr=1e-3)
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Points(), optimizers=(optimizer, None),
                  callbacks=[EmaCallback(model)])
trainer.train()
