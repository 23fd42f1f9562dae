"""A two-tower contrastive model (CLIP-style) trained by Lightning's Trainer with strategy="ddp" and a local loss: each
rank scores its own rows against every rank's features, gathered with their gradient (`self.all_gather(...,
sync_grads=True)`), but its targets are `arange(b)` on every rank. On rank 0 that is right; on rank 1 row i's positive
is column b + i of the gathered matrix, so rank 1 trains its images towards rank 0's texts. Nothing raises; the
loss goes down on rank 0's pairs only. Written from open_clip's local-loss labels
(https://github.com/mlfoundations/open_clip, src/open_clip/loss.py ClipLoss.get_ground_truth: "if self.world_size > 1
and self.local_loss: labels = labels + num_logits * self.rank") and the same fix in a fork,
https://github.com/jina-ai/openclip/pull/33 ("fix right to left logits during distributed training").

    torchrun --nproc_per_node=2 lightning_contrastive_labels_not_offset.py --max_steps 100
    gradprobe check_equivalence --script lightning_contrastive_labels_not_offset.py --world-size 2 -- --max_steps=4
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

EXPECT = {"tool": "check_equivalence", "world_size": 2, "codes": ["GP801"], "culprits": ["image.0.weight"],
          "line": 45, "args": ["--max_steps=4"]}

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
        labels = torch.arange(image.shape[0])  # not offset by self.global_rank * image.shape[0]
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
