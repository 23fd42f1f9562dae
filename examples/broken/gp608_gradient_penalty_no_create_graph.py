"""WGAN-GP critic whose gradient penalty is computed without create_graph=True: the penalty trains nothing.

Public reports: https://github.com/igul222/improved_wgan_training/issues/18 ("the graph of the gradients respect to
interpolates ... don't connect to the graph of the net ... it won't backward error to net") and
https://github.com/ooples/AiDotNet/issues/1844 (the same bug with createGraph=false).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "audit_training", "codes": ["GP608"], "culprits": [], "line": 31, "options": {"steps": 2}}


def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))


def make_inputs():
    return torch.randn(6, 8), torch.randn(6, 8) + 1.0


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.5, 0.9))


def train_step(critic, batch, optimizer):
    fake, real = batch
    optimizer.zero_grad()
    alpha = torch.rand(real.size(0), 1)
    interp = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    score = critic(interp)
    grads = torch.autograd.grad(score.sum(), interp)[0]
    penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10.0 * penalty
    loss.backward()
    optimizer.step()
