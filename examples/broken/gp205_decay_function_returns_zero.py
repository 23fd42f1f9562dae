"""Layer-wise lr decay through a helper that returns 0 for the deepest layer: `layer_scale` has a branch that gives 0
once depth reaches num_layers, so the embedding's group gets lr 0 and never moves. The finding names the helper's
`return 0.0` (the line that produced the 0), not the optimizer's constructor that called it.

From public threads on layer-wise lr decay driving learning rates to 0: jaehyunnn/ViTPose_pytorch issues #9 and #20
("the learning rate ... quickly becomes 0"; the fix was in the layer-decay code), and google-research/electra issue #64
(an off-by-one in the depth a layer-decay function assigns).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "check_optimizer_coverage", "codes": ["GP205"], "culprits": ["embed.weight"], "line": 31}


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


def layer_scale(depth, num_layers, decay=0.5):
    if depth >= num_layers:
        return 0.0
    return decay ** depth


def build_model():
    return Tiny()


def make_inputs():
    return torch.randint(0, 10, (4, 5))


def loss_fn(out, batch):
    return out.pow(2).mean()


def make_optimizer(model):
    named = [(model.head, 0), (model.blocks[1], 1), (model.blocks[0], 2), (model.embed, 3)]
    return torch.optim.AdamW([{"params": m.parameters(), "lr": 1e-3 * layer_scale(d, 3)} for m, d in named])


def train_step(model, batch, optimizer):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss
