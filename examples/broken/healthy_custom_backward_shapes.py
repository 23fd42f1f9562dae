"""The healthy twin of gp120_custom_backward_wrong_width.py: the custom backward returns a gradient of the scales' own
shape (hbb1/2d-gaussian-splatting issue #43). No error.
"""
import torch
import torch.nn as nn

EXPECT = {"tool": "trace_grad_path", "codes": [], "culprits": [], "healthy": True, "absent": ["GP120", "GP308"]}


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
        return grad * area, grad_scales  # one gradient column per scale column


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
