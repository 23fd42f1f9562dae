"""A Lightning module that measures a baseline accuracy in on_train_start; it leaves the model in eval mode.

Written from https://github.com/Lightning-AI/pytorch-lightning/issues/20216 ("training mode does not get switched on
automatically in the training_step, so if the model is put into eval mode accidentally by the user it stays this
way") and https://github.com/Lightning-AI/pytorch-lightning/issues/20986: Lightning sets train mode back only after a
validation loop, so dropout and batch norm run in inference mode for every training step.

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
val_x, val_y = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_start(self):
        self.eval()
        with torch.no_grad():
            print(f"baseline accuracy {(self.net(val_x).argmax(1) == val_y).float().mean().item():.3f}")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        ds = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))
        return DataLoader(ds, batch_size=16)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitClassifier())
