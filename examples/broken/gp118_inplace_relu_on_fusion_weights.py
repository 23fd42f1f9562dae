"""BiFPN-style fast normalised fusion whose learnable fusion weights go through `nn.ReLU(inplace=True)` in the forward:
the ReLU modifies the parameter itself, and torch refuses with "a leaf Variable that requires grad is being used in an
in-place operation" without naming it. The finding names the parameter and the forward's line, and the out-of-place form.

Written from zylo117/Yet-Another-EfficientDet-Pytorch issue #503
(https://github.com/zylo117/Yet-Another-EfficientDet-Pytorch/issues/503): a fusion module applying an in-place ReLU to its
nn.Parameter weights in forward hits this error; the answer is to apply the ReLU out of place (on a copy of the weights).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP118"], "culprits": ["fuse.weight"], "line": 23}


class Fuse(nn.Module):
    def __init__(self, eps=1e-4):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(2))
        self.weight_relu = nn.ReLU(inplace=True)

    def forward(self, a, b):
        w = self.weight_relu(self.weight)  # in place, on the parameter
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
