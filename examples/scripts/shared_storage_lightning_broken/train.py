"""The .data tie of ../shared_storage_broken/train.py under a Lightning Trainer: the LightningModule's decoder weight
is set with `.data` to the transpose of the encoder's (pytorch/xla#2719's tie), so configure_optimizers() hands Adam
two Parameters over one storage. diagnose stops the Trainer at its first optimizer step and finds it there (GP805).

    python train.py --max_steps 20
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class TiedAutoencoder(L.LightningModule):
    def __init__(self, d=12, k=4):
        super().__init__()
        self.encoder = nn.Linear(d, k, bias=False)
        self.decoder = nn.Linear(k, d, bias=False)
        self.decoder.weight.data = self.encoder.weight.data.t()

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return F.mse_loss(self.decoder(torch.tanh(self.encoder(x))), x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(64, 12, generator=g)), batch_size=8)


parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=20)
args = parser.parse_args()
trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(TiedAutoencoder())
