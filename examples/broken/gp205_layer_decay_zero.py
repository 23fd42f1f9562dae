"""Layer-wise learning-rate decay that gives the embedding lr 0: the scale `1 - depth / num_layers` reaches 0 at the
deepest depth, so the group built for the embedding gets lr 0 and never moves. The finding names the layer-decay
function's group line, not the optimizer's constructor.

From public threads on layer-wise lr decay driving learning rates to 0: jaehyunnn/ViTPose_pytorch issues #9 and #20
("the learning rate ... quickly becomes 0"; the fix was in the layer-decay code), and google-research/electra issue #64
(an off-by-one in the depth a layer-decay function assigns).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP205"], "culprits": ["embed.weight"], "line": 36}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.head = nn.Linear(8, 2)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(h.mean(1))


def layer_decay_groups(model, lr, num_layers=3):
    """depth 0 is the head, depth num_layers the embedding: scale = 1 - depth / num_layers."""
    named = [(model.head, 0)] + [(b, num_layers - 1 - i) for i, b in enumerate(model.blocks)] + [(model.embed, num_layers)]
    groups = []
    for module, depth in named:
        scale = 1 - depth / num_layers
        groups.append(
            {
                "params": list(module.parameters()),
                "lr": lr * scale,
            }
        )
    return groups


def build_model():
    return Tiny()


def make_inputs():
    return torch.randint(0, 10, (4, 5))


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    return torch.optim.AdamW(layer_decay_groups(model, 1e-3))
