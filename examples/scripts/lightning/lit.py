"""A LightningModule: an autoencoder-style regressor whose training_step calls its submodules."""

import lightning as L
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class LitModel(L.LightningModule):
    def __init__(self, d_in=16, d_hidden=32, d_out=4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden))
        self.head = nn.Linear(d_hidden, d_out)

    def training_step(self, batch, batch_idx):
        x, y = batch
        z = self.encoder(x)
        loss = F.mse_loss(self.head(z), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g))
        return DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
