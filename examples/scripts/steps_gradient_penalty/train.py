"""The healthy twin of steps_gradient_penalty_broken: the penalty's gradient is taken with create_graph=True.

Written from https://github.com/igul222/improved_wgan_training/issues/18 ("the graph of the gradients respect to
interpolates data don't connect to the graph of the net ... if I plus gradient penalty to loss, it won't work");
the same bug in other code: https://github.com/ooples/AiDotNet/issues/1844 ("createGraph=false in nested tape").

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

critic = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))


def gradient_penalty(critic, real, fake):
    alpha = torch.rand(real.size(0), 1)
    interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    grad = torch.autograd.grad(critic(interp).sum(), interp, create_graph=True)[0]
    return ((grad.norm(2, dim=1) - 1) ** 2).mean()


for _step in range(args.steps):
    real, fake = torch.randn(16, 4) + 2, torch.randn(16, 4)
    loss = critic(fake).mean() - critic(real).mean() + 10 * gradient_penalty(critic, real, fake)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
