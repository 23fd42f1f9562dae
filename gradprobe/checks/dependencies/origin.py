"""Inside the first block whose output has a leak: the module that makes it, measured.

One more probe forward with every module of the block hooked (their tensor inputs and first tensor output kept, in the
order the modules finish), then, in that order, one backward per kept tensor laid out like the model's positions
(batch, position, ...): the first module whose output has the leak while none of its inputs has it computed the leak
itself. An attention whose mask lets t see t+1 is such a module (its projections' outputs do not have the leak, its
output does); so is a layer that mixes positions or examples outside any attention (a statistic over the sequence or
the batch read back at every position: a mean, a softmax, a norm over those axes). The caller says which it was, and
blames the attention only in the first case.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.dependencies.claims import Layout, layout
from gradprobe.checks.dependencies.harness import probed, untouched
from gradprobe.checks.dependencies.jacobian import Leak

MAX_MODULES = 64  # the modules of one block measured (one backward each, in the order they finish)


def _first_tensor(out: Any) -> torch.Tensor | None:
    t = out[0] if isinstance(out, (tuple, list)) and out else out
    return t if isinstance(t, torch.Tensor) else None


def _has_leak(h: torch.Tensor, lay: Layout, leak: Leak, leaves: list[torch.Tensor], gen: torch.Generator) -> bool | None:
    """Whether h at the leak's (row, position) depends on an input it must not see (None: h is not laid out so)."""
    if h.dim() < 2 or h.shape[0] != lay.B or h.shape[1] not in (lay.T, 1) or not h.requires_grad \
            or not h.is_floating_point():
        return None
    row = h[leak.b, leak.t if h.shape[1] == lay.T else 0]  # a size-1 position axis is read by every position
    r = torch.randn(row.shape, generator=gen).to(row.dtype)
    grads = torch.autograd.grad(row, leaves, r, retain_graph=True, allow_unused=True)
    return any(g is not None and any(float(g[b, s].abs().sum()) > 0 for b, s in leak.seen[:64]) for g in grads)


def leak_origin(model: nn.Module, batch: Any, loss_fn: Any, user: Any, block: str, leak: Leak,
                claim_leaf: Any) -> tuple[str, dict | None] | None:
    """(the path of the first module inside `block` whose output has the leak and whose inputs do not, the user's line
    of the first op run in that module's own code whose output has it); None when no module of the block could be
    measured so. `claim_leaf(lay)`: the index of the token leaf the claim is about (a future leak is measured from it
    only), or None."""
    kept: list[tuple[str, list[torch.Tensor], torch.Tensor]] = []
    handles = []
    inside = [(n, m) for n, m in model.named_modules() if n.startswith(block + ".")]
    for name, m in inside[:MAX_MODULES]:
        def post(mod: nn.Module, args: Any, kwargs: dict[str, Any], out: Any, _n: str = name) -> None:
            t = _first_tensor(out)
            if t is not None:
                ins = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
                kept.append((_n, ins, t))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    try:
        with untouched(model):
            probe = probed(model, batch, loss_fn, user, record=True)
            lay = layout(probe)
            if lay is None:
                return None
            only = claim_leaf(lay) if leak.kind == "future" else None
            leaves = [lf.tensor for i, lf in enumerate(lay.token_leaves) if only is None or i == only]
            gen = torch.Generator().manual_seed(1)
            for name, ins, out in kept:
                if not _has_leak(out, lay, leak, leaves, gen):
                    continue
                # its inputs laid out per position (others, such as a relative position bias, cannot be told apart)
                measured = [m for m in (_has_leak(x, lay, leak, leaves, gen) for x in ins if x.requires_grad) if m is not None]
                if measured and not any(measured):
                    return name, _first_line(probe, name, lay, leak, leaves, gen)
    finally:
        for h in handles:
            h.remove()
    return None


def _first_line(probe: Any, module: str, lay: Layout, leak: Leak, leaves: list[torch.Tensor],
                gen: torch.Generator) -> dict | None:
    """The user's line of the first op run in `module`'s own forward (not in a module inside it) whose output has the
    leak: the reduction over the positions or the batch (a mean over dim 1 has a size-1 position axis, read by all)."""
    made = {id(t): t for t in probe.keep if isinstance(t, torch.Tensor)}
    for op in probe.ops:
        if op.module != module or op.location is None or op.library_line is not None or op.output not in made:
            continue
        if _has_leak(made[op.output], lay, leak, leaves, gen):
            return dict(op.location)
    return None
