"""A Lightning module that builds its head in setup(), which runs before configure_optimizers (the healthy twin of
lightning_late_head_broken, which builds it in on_fit_start).

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
args = parser.parse_args()
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = None

    def setup(self, stage):
        self.head = nn.Linear(32, int(data.tensors[1].max()) + 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.head(self.body(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(data, batch_size=16)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitClassifier())
