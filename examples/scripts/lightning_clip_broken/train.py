"""A Lightning module that clips its head's gradient in on_before_optimizer_step, with max_norm=0.

Written from https://github.com/OpenNMT/OpenNMT-py/issues/1140 ("the grads of parameters will be zero when set the
-max_grad_norm 0"): clip_grad_norm_(..., max_norm=0) does not mean "no clipping", it scales every gradient by 0, so
the head trains nothing while the loss and the backward look normal. Lightning calls on_before_optimizer_step between
the backward and optimizer.step(), inside the closure it hands to the optimizer.

    python train.py --max_steps 100
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--head_max_norm", type=float, default=0.0)  # meant: 0 = no clipping
args = parser.parse_args()


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(self.body(x)), y)

    def on_before_optimizer_step(self, optimizer):
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), max_norm=args.head_max_norm)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
        return DataLoader(ds, batch_size=8)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitClassifier())
