"""The healthy twin of lightning_accum_broken: a Lightning module trained with accumulate_grad_batches=4 whose
training_step returns its mean loss as it is; Lightning's automatic optimization divides it by the accumulation steps
before backward, once, so each optimizer step gets the mean gradient over its 4 batches.

Written from the public threads https://github.com/Lightning-AI/pytorch-lightning/issues/13243 and
https://github.com/Lightning-AI/pytorch-lightning/issues/15315 (Lightning normalises the training_step loss by
accumulate_grad_batches before backward) and https://github.com/Lightning-AI/pytorch-lightning/issues/87 (why the
division belongs before backward, once).

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
parser.add_argument("--accumulate", type=int, default=4)
parser.add_argument("--divide_again", type=int, default=0)  # 1: the bug of lightning_accum_broken
args = parser.parse_args()


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.head(self.body(x)), y)
        if args.divide_again:
            loss = loss / self.trainer.accumulate_grad_batches  # Lightning divides by it too
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(128, 8, generator=g), torch.randint(0, 3, (128,), generator=g))
        return DataLoader(ds, batch_size=8)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    accumulate_grad_batches=args.accumulate)
trainer.fit(LitClassifier())
