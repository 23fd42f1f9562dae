"""The healthy twin of gp118_wgan_clip_outside_no_grad.py: the WGAN critic's weight clipping runs under
`torch.no_grad()` (https://discuss.pytorch.org/t/leaf-variable-was-used-in-an-inplace-operation/308). No error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP118", "GP100"]}


def build_model():
    return nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1, bias=False))  # a critic's bias cancels in its loss


def make_inputs():
    return torch.randn(6, 4), torch.randn(6, 4) + 1.0


def make_optimizer(model):
    return torch.optim.RMSprop(model.parameters(), lr=5e-5)


def train_step(critic, batch, optimizer):
    real, fake = batch
    optimizer.zero_grad()
    loss = critic(fake).mean() - critic(real).mean()
    loss.backward()
    optimizer.step()
    with torch.no_grad():  # the clipping is an update of the weights, not part of the graph
        for p in critic.parameters():
            p.clamp_(-0.01, 0.01)
    return loss
