"""A tiny one-stage detector trained at two ranks: its box-regression loss is added only when the batch has objects.

Objects are sparse (about one anchor in twenty), so some batches have none. The box head runs on every rank, but on
a rank whose batch has no positive anchor its output never reaches the loss: its parameters get no gradient there,
DistributedDataParallel's bucket is never filled on that rank, and training stops with "Expected to have finished
reduction in the prior iteration". Written from https://github.com/ultralytics/ultralytics/pull/26012 (`if
fg_mask.sum(): loss[0], loss[2] = self.bbox_loss(pred_distri, ...)` drops the box branch from the graph when a
mini-batch has no assigned targets; the fix adds `(pred * 0).sum()`, as the neighbouring branches already did).

With the default seed 0, rank 0's batch (seed 0) has two objects and rank 1's (seed 1) none. Adding
`loss = loss + 0 * boxes.sum()` when there is no positive keeps the box head in every rank's loss: then nothing is
reported.

    gradprobe diagnose examples/ranks/gp703_box_loss_without_positives.py --world-size 2
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = {"tool": "diagnose", "world_size": 2, "codes": ["GP703"], "culprits": ["box_head.weight", "box_head.bias"],
          "line": 35, "ranks": [1], "absent": ["GP704", "GP706", "GP112"]}

OBJECT_RATE = 0.05


class TinyDetector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.cls_head = nn.Linear(32, 1)
        self.box_head = nn.Linear(32, 4)

    def forward(self, anchors):
        h = self.backbone(anchors)
        return self.cls_head(h).squeeze(-1), self.box_head(h)


def build_model():
    return TinyDetector()


def make_inputs():
    anchors = torch.randn(8, 10)
    objects = torch.rand(8) < OBJECT_RATE
    return {"anchors": anchors, "objects": objects, "boxes": torch.randn(8, 4)}


def loss_fn(out, batch):
    logits, boxes = out
    positive = batch["objects"]
    loss = F.binary_cross_entropy_with_logits(logits, positive.float())
    if positive.any():  # no positive anchor on this rank: the box branch leaves the graph
        loss = loss + F.smooth_l1_loss(boxes[positive], batch["boxes"][positive])
    return loss


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)
