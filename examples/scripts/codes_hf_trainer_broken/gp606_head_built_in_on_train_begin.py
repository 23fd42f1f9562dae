"""The Hugging Face Trainer with a callback that builds the classifier head in on_train_begin, once the label count is
known: the Trainer built its optimizer before that callback ran, so the head gets gradients at every step and never
moves.

Written from https://github.com/Lightning-AI/pytorch-lightning/issues/16170 (a module built in a hook after the
optimizers were configured is left out of them) and the remedy the PyTorch docs give, Optimizer.add_param_group
(https://docs.pytorch.org/docs/stable/generated/torch.optim.Optimizer.add_param_group.html), or building the head
before the Trainer.

    python gp606_head_built_in_on_train_begin.py --max_steps 100
"""

import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

EXPECT = {"tool": "audit_training", "codes": ["GP606"], "culprits": ["head.weight", "head.bias"], "line": 57,
          "args": ["--max_steps=8"], "options": {"steps": 3}}
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


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = None  # built when the number of labels is known

    def forward(self, x, labels=None):
        logits = self.head(self.backbone(x))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class BuildHead(TrainerCallback):
    def __init__(self, model, num_labels):
        self.model, self.num_labels = model, num_labels

    def on_train_begin(self, args, state, control, **kwargs):
        self.model.head = nn.Linear(32, self.num_labels)


model = Classifier()
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=8,
                                  learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=10, use_cpu=True,
                                  dataloader_num_workers=0, remove_unused_columns=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Points(), callbacks=[BuildHead(model, 3)])
trainer.train()
