"""A Lightning WGAN-GP critic whose gradient penalty is computed without create_graph=True: the penalty trains nothing.

Public report: https://github.com/igul222/improved_wgan_training/issues/18 ("the graph of the gradients respect to
interpolates data don't connect to the graph of the net ... if I plus gradient penalty to loss, it won't work").
Lightning runs training_step under torch.enable_grad(), so nothing raises.

    python gp608_gradient_penalty_no_create_graph.py --max_steps 100
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP608"], "culprits": [], "line": 32, "args": ["--max_steps=8"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
args = parser.parse_args()


class LitCritic(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))

    def gradient_penalty(self, real, fake):
        alpha = torch.rand(real.size(0), 1)
        interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        grad = torch.autograd.grad(self.critic(interp).sum(), interp)[0]
        return ((grad.norm(2, dim=1) - 1) ** 2).mean()

    def training_step(self, batch, batch_idx):
        (real,) = batch
        fake = torch.randn_like(real)
        return self.critic(fake).mean() - self.critic(real).mean() + 10 * self.gradient_penalty(real, fake)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4, betas=(0.5, 0.9))

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(64, 4, generator=g) + 2), batch_size=16)


trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitCritic())
