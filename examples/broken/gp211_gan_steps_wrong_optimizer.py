"""A GAN step that calls the generator's optimizer after the discriminator's backward: `d_loss.backward()` reached only
the discriminator (the fakes are detached), but `optimizer.step()` (the generator's) ran there instead of
`model.opt_d.step()`. The finding names the step's line and the optimizer that held the gradients.

From public threads on which optimizer a GAN step updates: devnag/pytorch-generative-adversarial-networks issue #14
("does this line train the discriminator?"; the answer compares D's parameters before and after g_optimizer.step()),
and clovaai/stargan-v2 issue #16 (separate optimizers, each stepped after its own network's loss).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP211"], "culprits": ["D.0.weight"], "line": 46}


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.G = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, z):
        return self.D(self.G(z))


def build_model():
    return GAN()


def make_inputs():
    return {"z": torch.randn(8, 2), "real": torch.randn(8, 4)}


def make_optimizer(model):
    model.opt_d = torch.optim.Adam(model.D.parameters(), lr=2e-4)
    return torch.optim.Adam(model.G.parameters(), lr=2e-4)


def train_step(model, batch, optimizer):
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    fake = model.G(batch["z"])
    model.opt_d.zero_grad()
    d_loss = F.binary_cross_entropy_with_logits(model.D(batch["real"]), ones) + \
        F.binary_cross_entropy_with_logits(model.D(fake.detach()), zeros)
    d_loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.D(fake), ones)
    g_loss.backward()
    optimizer.step()
    return g_loss
