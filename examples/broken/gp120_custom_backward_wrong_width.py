"""A custom autograd.Function (a splatting-style renderer reduced to a weighted sum) whose backward returns the
gradient of its per-point scales with 2 columns where the scales have 3: torch raises "Function RenderBackward returned
an invalid gradient at index 1 - got [5, 2] but expected shape compatible with [5, 3]" and names neither the argument
nor the line. The finding names the forward argument at index 1 (`scales`), the parameter passed there, the backward's
return line and the apply() line.

Written from hbb1/2d-gaussian-splatting issue #43 (https://github.com/hbb1/2d-gaussian-splatting/issues/43: "Function
_RasterizeGaussiansBackward returned an invalid gradient at index 5 - got [231550, 2] but expected shape compatible
with [231550, 3]"; the scales passed had 3 columns where the backward produces 2).
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": ["GP120"], "culprits": ["scales"], "line": 28}


class Render(torch.autograd.Function):
    @staticmethod
    def forward(ctx, colors, scales):
        ctx.save_for_backward(colors, scales)
        return colors * scales.prod(dim=1, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        colors, scales = ctx.saved_tensors
        area = scales.prod(dim=1, keepdim=True)
        grad_scales = (grad * colors).sum(dim=1, keepdim=True) * area / scales
        return grad * area, grad_scales[:, :2]  # the renderer's 2-D scales: one column short


class Splats(nn.Module):
    def __init__(self):
        super().__init__()
        self.colors = nn.Parameter(torch.rand(5, 3))
        self.scales = nn.Parameter(torch.rand(5, 3) + 0.5)

    def forward(self, light):
        return Render.apply(self.colors, self.scales) * light


def build_model():
    return Splats()


def make_inputs():
    return torch.rand(5, 3)
