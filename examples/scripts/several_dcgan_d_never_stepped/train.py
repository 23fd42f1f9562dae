"""The DCGAN loop of several_dcgan with one bug: the discriminator is cleared and backpropagated at every iteration,
but optimizerD.step() is never called, so the discriminator never moves while the generator trains against it, and
nothing raises.

Written from zhaoyuzhi/deepfillv2 issue #6 (https://github.com/zhaoyuzhi/deepfillv2/issues/6: the discriminator's
optimizer.step() missing from the trainer) and zhaoyuzhi/DeblurGANv2-MobileNetv123-PyTorch issue #7
(https://github.com/zhaoyuzhi/DeblurGANv2-MobileNetv123-PyTorch/issues/7: "there is no call to optimizer_D1.step()").

    python train.py --niter 100
"""

import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--niter", type=int, default=100)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--nz", type=int, default=8)
args = parser.parse_args()
torch.manual_seed(0)
nz, ngf, ndf = args.nz, 8, 8


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, 3, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, x):
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


netG = Generator()
netD = Discriminator()
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real_label, fake_label = 1.0, 0.0

for _i in range(args.niter):
    real = torch.rand(args.batch_size, 3, 8, 8) * 2 - 1
    # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    label = torch.full((args.batch_size,), real_label)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    noise = torch.randn(args.batch_size, nz, 1, 1)
    fake = netG(noise)
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    # (2) update G: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(real_label)
    errG = criterion(netD(fake), label)
    errG.backward()
    optimizerG.step()
