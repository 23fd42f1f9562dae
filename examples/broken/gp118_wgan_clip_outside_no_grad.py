"""A WGAN critic whose weight clipping runs on the parameters themselves, after optimizer.step() and outside
`torch.no_grad()`: torch refuses with "a leaf Variable that requires grad is being used in an in-place operation" and
names no tensor. The finding names the parameter, the clamp's line, and the `no_grad` form that was meant.

Written from the public threads on this error and on WGAN clipping: discuss.pytorch.org "Leaf variable was used in an
inplace operation" (https://discuss.pytorch.org/t/leaf-variable-was-used-in-an-inplace-operation/308, the answer:
`with torch.no_grad():` for an update that is not meant to be differentiable) and
znxlwm/pytorch-generative-model-collections issue #31 (https://github.com/znxlwm/pytorch-generative-model-collections/issues/31,
the critic's parameters clipped after optimizer.step(), there through `.data`).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP118"], "culprits": ["0.weight"], "line": 36}


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
    for p in critic.parameters():
        p.clamp_(-0.01, 0.01)  # WGAN weight clipping, recorded by autograd: torch raises
    return loss
