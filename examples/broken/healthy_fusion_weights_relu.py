"""The healthy twin of gp118_inplace_relu_on_fusion_weights.py: the fusion weights go through an out-of-place ReLU
(zylo117/Yet-Another-EfficientDet-Pytorch issue #503). No error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP118", "GP100"]}


class Fuse(nn.Module):
    def __init__(self, eps=1e-4):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(2))
        self.weight_relu = nn.ReLU()

    def forward(self, a, b):
        w = self.weight_relu(self.weight)  # out of place: a new tensor
        w = w / (w.sum() + self.eps)
        return w[0] * a + w[1] * b


class Neck(nn.Module):
    def __init__(self):
        super().__init__()
        self.p3, self.p4 = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)
        self.fuse = Fuse()

    def forward(self, x):
        return self.fuse(self.p3(x), self.p4(x))


def build_model():
    return Neck()


def make_inputs():
    return torch.randn(2, 4, 8, 8)
