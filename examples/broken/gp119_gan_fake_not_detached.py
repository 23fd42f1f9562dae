"""A GAN step whose discriminator loss uses the generator's fakes without `.detach()`: d_loss.backward() runs through the
generator's graph and frees it, then g_loss.backward() (on a new discriminator forward of the same fakes) runs into that
freed graph. torch raises "Trying to backward through the graph a second time"; the finding names the fakes' op and
lines, measured on the two graphs, where torch suggests retain_graph=True.

Written from pytorch/examples issue #116 (https://github.com/pytorch/examples/issues/116): "Missed detach when implementing
dcgan in pytorch, and it gives me this error: RuntimeError: Trying to backward through the graph second time".
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP119"], "culprits": [], "line": 41}


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def build_model():
    return GAN()


def make_inputs():
    return torch.randn(6, 2), torch.randn(6, 4)


def make_optimizer(model):
    model.opt_d = torch.optim.Adam(model.D.parameters(), lr=2e-4)
    return torch.optim.Adam(model.G.parameters(), lr=2e-4)


def train_step(model, batch, optimizer):
    z, real = batch
    fake = model.G(z)
    ones, zeros = torch.ones(6, 1), torch.zeros(6, 1)
    model.opt_d.zero_grad()
    d_loss = (F.binary_cross_entropy_with_logits(model.D(real), ones)
              + F.binary_cross_entropy_with_logits(model.D(fake), zeros))  # fake not detached
    d_loss.backward()
    model.opt_d.step()
    optimizer.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.D(fake), ones)
    g_loss.backward()
    optimizer.step()
    return g_loss
