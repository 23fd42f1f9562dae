"""What an activation or an index op did to a value on the gradient path, measured as it ran (GP318, checks/trace/zero_ops.py).

Two shapes of "the gradient stopped here", both decided by what the op does with its operands, never by names:
- a dead activation: a relu/clamp/hardtanh/threshold whose every input lay in the region where its derivative is 0
  (relu: every input <= 0; a clamp: every input outside its bounds), so nothing flows back through it;
- an empty selection: an index op (`x[mask]`, `index_select`, `gather`, `masked_select`, ...) that selected none of a
  non-empty value (`logits[labels != -100]` when every label is -100).
The test here runs on every such op of the traced step and costs one reduction; the measurements for the finding
(the input range, the fraction in the dead region, a bias that alone puts every unit there) are taken only for the
rare op that is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# relu-like ops: the output is 0 (or the lower bound) where the derivative is 0
RELU_OPS = frozenset({"relu", "relu_"})
HARDTANH_OPS = frozenset({"hardtanh", "hardtanh_", "relu6"})
CLAMP_OPS = frozenset({"clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_"})
THRESHOLD_OPS = frozenset({"threshold", "threshold_"})
DEAD_OPS = RELU_OPS | HARDTANH_OPS | CLAMP_OPS | THRESHOLD_OPS
INDEX_OPS = frozenset({"__getitem__", "index_select", "gather", "masked_select", "take", "take_along_dim"})
BIAS_DEPTH = 3  # graph nodes walked back from the activation's input to find the bias added into it


@dataclass
class DeadRegion:
    """A dead activation: where its derivative is 0, and what was measured of its inputs."""

    region: str  # the dead region as text ("<= 0", "< 5", "outside [0, 6]")
    dead: int  # inputs in the dead region
    total: int
    span: tuple[float, float] | None = None  # smallest and largest input (None for an in-place op: overwritten)
    bias: dict[str, Any] | None = None  # a bias added into the input that alone lies in the dead region
    bounds: dict[str, float | None] = field(default_factory=dict)
    summed: bool = False  # the gradient that reached it was one value everywhere: its output is a term of the loss


def _number(v: Any) -> float | None:
    if isinstance(v, torch.Tensor):
        return float(v) if v.numel() == 1 else None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _arg(args: Any, kwargs: Mapping[str, Any], at: int, *names: str) -> Any:
    if len(args) > at:
        return args[at]
    return next((kwargs[n] for n in names if n in kwargs), None)


def _bounds(name: str, args: Any, kwargs: Mapping[str, Any]) -> tuple[float | None, float | None, bool] | None:
    """(lower, upper, strict) bounds of the region where the op passes a gradient; None when they cannot be read."""
    if name in RELU_OPS:
        return 0.0, None, False
    if name in THRESHOLD_OPS:
        th = _number(_arg(args, kwargs, 1, "threshold"))
        return (th, None, False) if th is not None else None
    if name == "relu6":
        return 0.0, 6.0, False
    if name in HARDTANH_OPS:
        lo, hi = _arg(args, kwargs, 1, "min_val"), _arg(args, kwargs, 2, "max_val")
        return _number(-1.0 if lo is None else lo), _number(1.0 if hi is None else hi), False
    if name.startswith("clamp_min"):
        return _number(_arg(args, kwargs, 1, "min")), None, True
    if name.startswith("clamp_max"):
        return None, _number(_arg(args, kwargs, 1, "max")), True
    lo, hi = _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
    lo_n, hi_n = _number(lo), _number(hi)
    if (lo is not None and lo_n is None) or (hi is not None and hi_n is None) or (lo_n is None and hi_n is None):
        return None  # a tensor bound: not read
    return lo_n, hi_n, True


def _region(lo: float | None, hi: float | None, strict: bool) -> str:
    lt, gt = ("<", ">") if strict else ("<=", ">=")
    if hi is None:
        return f"{lt} {lo:g}"
    if lo is None:
        return f"{gt} {hi:g}"
    return f"outside [{lo:g}, {hi:g}]"


def _in_dead(t: torch.Tensor, lo: float | None, hi: float | None, strict: bool) -> torch.Tensor:
    below = (t < lo if strict else t <= lo) if lo is not None else torch.zeros_like(t, dtype=torch.bool)
    above = (t > hi if strict else t >= hi) if hi is not None else torch.zeros_like(t, dtype=torch.bool)
    return below | above


def dead_activation(name: str, args: Any, kwargs: Mapping[str, Any], out: torch.Tensor,
                    params: Mapping[int, torch.Tensor]) -> DeadRegion | None:
    """The dead region of an activation whose every output sits at its bounds (every input dead), else None."""
    if name not in DEAD_OPS or not out.is_floating_point() or out.numel() == 0:
        return None
    bounds = _bounds(name, args, kwargs)
    if bounds is None:
        return None
    lo, hi, strict = bounds
    with torch.no_grad():
        # the output sits at a bound wherever the input was in the dead region (a superset: the backward hook confirms)
        if bool(out.any()) if name in RELU_OPS else not bool(_in_dead(out, lo, hi, strict=False).all()):
            return None
        x = args[0] if args and isinstance(args[0], torch.Tensor) and args[0] is not out else None
        dead = int(_in_dead(x, lo, hi, strict).sum()) if x is not None else out.numel()
        span = (float(x.min()), float(x.max())) if x is not None and x.is_floating_point() else None
        bias = _bias(x, lo, hi, strict, params) if x is not None else None
    return DeadRegion(_region(lo, hi, strict), dead, out.numel(), span, bias, {"min": lo, "max": hi})


def _bias(x: torch.Tensor, lo: float | None, hi: float | None, strict: bool,
          params: Mapping[int, torch.Tensor]) -> dict[str, Any] | None:
    """A one-dimensional parameter added into `x` (a few graph nodes back) whose every value is in the dead region and
    without which some inputs would leave it: the bias is what made the unit dead (not a bound above the data)."""
    seen: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(x.grad_fn, 0, False)]
    while stack:
        node, depth, by_channel = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if var is not None and id(var) in params and var.dim() == 1 and var.numel() > 1 \
                and var.shape[0] in (x.shape[1] if x.dim() > 1 else -1, x.shape[-1]):
            if bool(_in_dead(var.detach(), lo, hi, strict).all()) \
                    and _alive_without(x, var.detach(), lo, hi, strict, by_channel):
                return {"tensor": var, "min": float(var.min()), "max": float(var.max())}
        if depth < BIAS_DEPTH:
            # a convolution (or a norm over channels) adds its bias on dim 1, a linear on the last dim
            channel = x.dim() > 2 and type(node).__name__.startswith(("Convolution", "CudnnConvolution", "NativeBatchNorm",
                                                                        "CudnnBatchNorm", "NativeGroupNorm"))
            stack.extend((nf, depth + 1, channel) for nf, _ in getattr(node, "next_functions", ()))
    return None


def _alive_without(x: torch.Tensor, bias: torch.Tensor, lo: float | None, hi: float | None, strict: bool,
                   by_channel: bool) -> bool:
    """Whether some input would be out of the dead region with `bias` taken out of it (on the channel dim)."""
    n = bias.shape[0]
    b = bias.reshape(n, *([1] * (x.dim() - 2))) if by_channel or x.shape[-1] != n else bias
    return not bool(_in_dead(x - b, lo, hi, strict).all())


def _index_of(name: str, args: Any, kwargs: Mapping[str, Any]) -> Any:
    if name == "__getitem__":
        key = args[1] if len(args) > 1 else None
        keys = key if isinstance(key, (tuple, list)) else (key,)
        return next((k for k in keys if isinstance(k, torch.Tensor)), None)
    if name in ("index_select", "gather", "take_along_dim"):
        return _arg(args, kwargs, 2, "index", "indices")
    if name == "take":
        return _arg(args, kwargs, 1, "index")
    return _arg(args, kwargs, 1, "mask")


def empty_selection(name: str, args: Any, kwargs: Mapping[str, Any], out: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """(the index or mask, how many positions it could select) for an index op that selected nothing, else None."""
    if name not in INDEX_OPS or out.numel() != 0 or not args or not isinstance(args[0], torch.Tensor):
        return None
    x, index = args[0], _index_of(name, args, kwargs)
    if x.numel() == 0 or not isinstance(index, torch.Tensor):
        return None
    if index.dtype == torch.bool:
        return index, index.numel()
    dim = _number(_arg(args, kwargs, 1, "dim")) if name in ("index_select", "gather", "take_along_dim") else None
    total = x.shape[int(dim)] if dim is not None and x.dim() > 0 else (x.shape[0] if name == "__getitem__" else x.numel())
    return index, int(total)
