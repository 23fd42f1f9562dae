"""A tied autoencoder whose decoder is "tied" to the encoder with `.data`: the decoder's weight becomes a transposed
view of the encoder's storage, but it stays a Parameter object of its own. Each gets its own .grad (its part of the
matrix's gradient) and Adam, holding both, updates the one matrix twice per step with two moment states.

After pytorch/xla#2719 ("Weights tying/sharing in XLA": `model.decoder.weight.data = model.encoder.weight.data.t()`,
answered "If you set the `.weight` instead of `.weight.data`, the behavior is consistent with the docs"), and the
consequence torch/DEPRECEATED-torch7-distro#156 names for parameters shared without their gradients ("using the optim
package loses half the gradient updates"). Found by storage identity, at the line of the `.data` tie.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP805"], "culprits": ["encoder.weight", "decoder.weight"],
          "line": 23}


class TiedAutoencoder(nn.Module):
    def __init__(self, d=12, k=4):
        super().__init__()
        self.encoder = nn.Linear(d, k, bias=False)
        self.decoder = nn.Linear(k, d, bias=False)
        self.decoder.weight.data = self.encoder.weight.data.t()

    def forward(self, x):
        return self.decoder(torch.tanh(self.encoder(x)))


def build_model():
    return TiedAutoencoder()


def make_inputs():
    return torch.randn(8, 12)


def loss_fn(out, batch):
    return F.mse_loss(out, batch)


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
