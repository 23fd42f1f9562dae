"""What gradcheck measures on one custom Function call: float64 copies of its inputs and full Jacobians both ways
(where its backward sits in the source, GP4xx's locations, is core/function_calls.backward_lines).

Analytical Jacobians come from the Function's own backward (one backward per output element), numerical ones from
central differences; inputs too large for a full Jacobian are sliced along a shared leading (batch) dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gradprobe.checks.core.torchcompat import INVALID_GRADIENT, WRONG_GRADIENT_COUNT, WRONG_GRADIENT_SHAPE

MAX_INPUT_ELEMS = 600
MAX_OUTPUT_ELEMS = 2048

Loc = dict[str, Any]


def as_double(inputs: tuple) -> tuple[tuple, bool]:
    out, converted = [], False
    for a in inputs:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            if a.dtype != torch.float64:
                converted = True
            d = a.detach().to(torch.float64).clone()
            d.requires_grad_(a.requires_grad)
            out.append(d)
        else:
            out.append(a)
    return tuple(out), converted


def shrink(inputs: tuple) -> tuple[tuple, str | None]:
    """Slice a shared leading (batch) dimension so a full Jacobian fits; keeps the shape contract."""
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    total = sum(a.numel() for a in tensors if a.requires_grad)
    if total <= MAX_INPUT_ELEMS:
        return inputs, None
    big = max(tensors, key=lambda t: t.numel())
    if big.dim() < 2:
        return inputs, None
    b = big.shape[0]
    keep = max(1, min(b, 2))
    shrunk = []
    for a in inputs:
        if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == b:
            s = a.detach()[:keep].clone()
            s.requires_grad_(a.requires_grad)
            shrunk.append(s)
        else:
            shrunk.append(a)
    return tuple(shrunk), f"sliced the leading dimension {b} -> {keep} on inputs that share it"


def flat_out(out: Any) -> list[torch.Tensor]:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]


def numerical_jacobian(fn: Callable[..., Any], inputs: tuple, j: int, eps: float = 1e-6) -> torch.Tensor:
    x = inputs[j]
    base = [o.detach().reshape(-1) for o in flat_out(fn(*inputs))]
    n_out = sum(b.numel() for b in base)
    jac = torch.zeros(n_out, x.numel(), dtype=torch.float64)
    flat = x.detach().reshape(-1)
    with torch.no_grad():
        for i in range(x.numel()):
            orig = flat[i].item()
            flat[i] = orig + eps
            plus = torch.cat([o.detach().reshape(-1) for o in flat_out(fn(*inputs))])
            flat[i] = orig - eps
            minus = torch.cat([o.detach().reshape(-1) for o in flat_out(fn(*inputs))])
            flat[i] = orig
            jac[:, i] = (plus - minus) / (2 * eps)
    return jac


def analytical_jacobians(fn: Callable[..., Any], inputs: tuple, req: list[int]) -> list[torch.Tensor | None]:
    outs = flat_out(fn(*inputs))
    flat = torch.cat([o.reshape(-1) for o in outs])
    n_out = flat.numel()
    jacs = [torch.zeros(n_out, inputs[j].numel(), dtype=torch.float64) for j in req]
    got_any = [False] * len(req)
    for k in range(n_out):
        go = torch.zeros(n_out, dtype=flat.dtype)
        go[k] = 1.0
        gos, off = [], 0
        for o in outs:
            gos.append(go[off:off + o.numel()].reshape(o.shape))
            off += o.numel()
        grads = torch.autograd.grad(outs, [inputs[j] for j in req], gos, retain_graph=True, allow_unused=True)
        for i, g in enumerate(grads):
            if g is not None:
                got_any[i] = True
                jacs[i][k] = g.detach().reshape(-1).to(torch.float64)
    return [jac if got else None for jac, got in zip(jacs, got_any, strict=True)]


def parse_structure_error(text: str) -> tuple[str, dict[str, Any]] | None:
    """autograd's own error about the backward's count or shapes: ("count" | "shape", what it says), else None."""
    m = WRONG_GRADIENT_COUNT.search(text)
    if m:
        return "count", {"expected": int(m.group(1)), "returned": int(m.group(2))}
    m = WRONG_GRADIENT_SHAPE.search(text)
    if m:
        return "shape", {"input_index": int(m.group(1)), "returned_shape": m.group(2), "input_shape": m.group(3)}
    m = INVALID_GRADIENT.search(text)
    if m:
        return "shape", {"input_index": int(m.group(1)), "problem": m.group(2)[:200]}
    return None
