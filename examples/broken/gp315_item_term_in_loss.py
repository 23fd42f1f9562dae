"""A classifier with an auxiliary reconstruction head whose loss is added as the number `.item()` returned: that term
is a constant to backward(), so the decoder learns nothing from it and the encoder learns from the classifier alone.

Public reports of a loss term with no graph behind it: https://github.com/yiranran/APDrawingGAN/issues/22 ("there is
no grad_fn for self.loss_G_chamfer2", a term summed into the generator's loss), https://github.com/samet-akcay/skip-ganomaly/issues/5
("this loss is acquired when the x_fake is detached. I think it makes no contribution to update the parameters").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "trace_grad_path", "codes": ["GP315"], "culprits": ["decoder.weight"], "line": 40,
          "severity": "error"}


class AuxAutoencoder(nn.Module):
    def __init__(self, d=10, h=16, k=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, h), nn.Tanh())
        self.classifier = nn.Linear(h, k)
        self.decoder = nn.Linear(h, d)


def build_model():
    return AuxAutoencoder()


def make_inputs():
    return {"x": torch.randn(8, 10), "y": torch.randint(0, 3, (8,))}


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    h = model.encoder(batch["x"])
    ce = F.cross_entropy(model.classifier(h), batch["y"])
    recon = F.mse_loss(model.decoder(h), batch["x"]).item()
    loss = ce + recon
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "ce": ce.item(), "recon": recon}
