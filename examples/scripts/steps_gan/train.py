"""The healthy twin of steps_gan_wrong_zero_grad: each optimizer clears its own network's gradients before the
backward() its step uses (the DCGAN loop), so neither network's gradients add up across iterations.

Written from Lightning-AI/pytorch-lightning issue #591 (https://github.com/Lightning-AI/pytorch-lightning/issues/591),
where clearing only one optimizer's gradients broke GAN training.

    python train.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()
torch.manual_seed(0)

netG = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 4))
netD = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
d_opt = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
g_opt = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)

for _step in range(args.steps):
    real = torch.randn(32, 4) * 0.5 + 1.0
    fake = netG(torch.randn(32, 2))
    # the discriminator's update
    d_opt.zero_grad()
    d_loss = (F.binary_cross_entropy_with_logits(netD(real), ones)
              + F.binary_cross_entropy_with_logits(netD(fake.detach()), zeros))
    d_loss.backward()
    d_opt.step()
    # the generator's update
    g_opt.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(netD(fake), ones)
    g_loss.backward()
    g_opt.step()
