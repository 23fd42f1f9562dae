"""Healthy twin of equiv_ranks_broken/lightning_contrastive_labels_not_offset.py: a two-tower contrastive model
(CLIP-style) trained by Lightning's Trainer with strategy="ddp" and a local loss, as open_clip's ClipLoss computes it
with `--local-loss --gather-with-grad`: each rank scores its own rows against every rank's features gathered with their
gradient (`self.all_gather(..., sync_grads=True)`), and its targets are offset by rank * local batch size. Lightning's
DDP average of the ranks' gradients is then the gradient of the same loss over the global batch in one process.
Public reference: https://github.com/mlfoundations/open_clip (src/open_clip/loss.py ClipLoss.get_ground_truth).

    torchrun --nproc_per_node=2 lightning_contrastive_labels_offset.py --max_steps 100
    gradprobe check_equivalence --script lightning_contrastive_labels_offset.py --world-size 2 -- --max_steps=4
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": [], "healthy": True, "args": ["--max_steps=4"],
          "absent": ["GP801", "GP806"]}

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--devices", type=int, default=2)
args = parser.parse_args()


class LitClip(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def training_step(self, batch, batch_idx):
        images, texts = batch
        image, text = F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1)
        all_image = self.all_gather(image, sync_grads=True).flatten(0, 1)
        all_text = self.all_gather(text, sync_grads=True).flatten(0, 1)
        labels = torch.arange(image.shape[0]) + self.global_rank * image.shape[0]  # this rank's rows in the gathered matrix
        scale = self.logit_scale.exp()
        return (F.cross_entropy(scale * image @ all_text.T, labels) + F.cross_entropy(scale * text @ all_image.T, labels)) / 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(64, 12, generator=g), torch.randn(64, 10, generator=g)), batch_size=4)


torch.manual_seed(0)
trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=args.devices, strategy="ddp", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LitClip())
