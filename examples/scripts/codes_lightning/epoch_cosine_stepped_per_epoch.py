"""The healthy twin of codes_lightning_broken/gp612_epoch_cosine_stepped_per_batch: the cosine schedule written in
epochs (T_max = max_epochs) is configured with interval "epoch", so Lightning steps it once per epoch.

Written from https://github.com/mllam/neural-lam/pull/693 ("T_max set to trainer.max_epochs ... with interval: epoch")
and https://github.com/ivadomed/ivadomed/issues/57.

    python epoch_cosine_stepped_per_epoch.py --epochs 10
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "absent": ["GP612", "GP603", "GP604"],
          "args": ["--epochs=10"], "options": {"steps": 4}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
args = parser.parse_args()


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(400, 8, generator=g), torch.randint(0, 3, (400,), generator=g))
        return DataLoader(ds, batch_size=16, shuffle=True)


trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitClassifier())
