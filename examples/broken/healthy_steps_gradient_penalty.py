"""WGAN-GP critic with create_graph=True: the penalty's gradient reaches the critic."""
import torch
import torch.nn as nn

EXPECT = {"tool": "audit_training", "codes": [], "healthy": True, "options": {"steps": 2},
          "absent": ["GP601", "GP602", "GP603", "GP604", "GP605", "GP606", "GP607", "GP608", "GP609"]}


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
    grads = torch.autograd.grad(critic(interp).sum(), interp, create_graph=True)[0]
    penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10.0 * penalty
    loss.backward()
    optimizer.step()
