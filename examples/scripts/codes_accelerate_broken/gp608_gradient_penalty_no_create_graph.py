"""An accelerate WGAN-GP critic loop whose gradient penalty is computed without create_graph=True: the penalty trains
nothing.

Public report: https://github.com/igul222/improved_wgan_training/issues/18 ("the graph of the gradients respect to
interpolates data don't connect to the graph of the net ... if I plus gradient penalty to loss, it won't work").

    accelerate launch gp608_gradient_penalty_no_create_graph.py --epochs 1
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "audit_training", "codes": ["GP608"], "culprits": [], "line": 35, "args": ["--epochs=1"],
          "options": {"steps": 3}}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 3, (64,), generator=g))
loader = DataLoader(data, batch_size=8)
critic = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
critic, optimizer, loader = accelerator.prepare(critic, optimizer, loader)


def gradient_penalty(critic, real, fake):
    alpha = torch.rand(real.size(0), 1)
    interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    grad = torch.autograd.grad(critic(interp).sum(), interp)[0]
    return ((grad.norm(2, dim=1) - 1) ** 2).mean()


for _epoch in range(args.epochs):
    for real, _ in loader:
        fake = torch.randn_like(real)
        optimizer.zero_grad()
        accelerator.backward(critic(fake).mean() - critic(real + 2).mean() + 10 * gradient_penalty(critic, real, fake))
        optimizer.step()
