"""Gradient accumulation, measured for the all-clear: the constant factor each micro-batch loss was multiplied by
before backward(), and so the accumulated gradient relative to what one backward over the whole batch gives.

`LossFactors` is entered around the observed steps. At each top-level `Tensor.backward()` it reads the loss's graph
from its top: every multiplication or division by a constant (`loss / accum_steps`, `loss * 0.25`), until the first
other operation, multiplied together. With k micro-batches of equal size whose losses are means, backward over the
full batch gives their mean gradient; the accumulated one is k x factor times that (1.00 when each loss is divided
by k, k when none is, 1/k when the division is applied twice).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from gradprobe.checks.steps.facts import AuditFacts, at

_SCALING = {"DivBackward0": -1, "MulBackward0": 1}
MAX_DEPTH = 16


def _constant(t: Any) -> float | None:
    if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.requires_grad:
        return float(t.detach().double().item())
    if isinstance(t, (int, float)):
        return float(t)
    return None


def loss_factor(loss: torch.Tensor) -> float:
    """The product of the constant multiplications/divisions at the top of the loss's graph (1.0: none)."""
    factor, node = 1.0, loss.grad_fn
    for _ in range(MAX_DEPTH):
        if node is None or node.name() not in _SCALING:
            break
        power, nexts = _SCALING[node.name()], node.next_functions
        try:
            if len(nexts) == 2 and nexts[1][0] is None:
                value, nxt = _constant(getattr(node, "_saved_other", None)), nexts[0][0]
            elif len(nexts) == 2 and nexts[0][0] is None and power == 1:
                value, nxt = _constant(getattr(node, "_saved_self", None)), nexts[1][0]
            else:
                break
        except RuntimeError:  # saved values freed (retain_graph=False after an earlier backward)
            break
        if value is None or value == 0:
            break
        factor, node = factor * value ** power, nxt
    return factor


class LossFactors:
    """The constant factor of each top-level Tensor.backward() call, in order."""

    def __init__(self) -> None:
        self.factors: list[float | None] = []
        self._orig: Callable[..., Any] | None = None
        self._depth = 0

    def __enter__(self) -> LossFactors:
        orig = self._orig = torch.Tensor.backward
        watch = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not watch._depth:
                try:
                    watch.factors.append(loss_factor(tensor) if tensor.numel() == 1 else None)
                except Exception:  # reading the graph must never break the user's step
                    watch.factors.append(None)
            watch._depth += 1
            try:
                return orig(tensor, *args, **kwargs)
            finally:
                watch._depth -= 1

        setattr(torch.Tensor, "backward", backward)  # noqa: B010 (restored on exit)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        setattr(torch.Tensor, "backward", self._orig)  # noqa: B010


def accumulation_lines(factors: list[float | None], facts: AuditFacts) -> list[str]:
    """The verified line for steps with several backward() calls, when every backward was seen here too."""
    counts = [len(s.backwards) for s in facts.opt_steps]
    seen = sum(1 for e in facts.events if e.kind == "backward")
    if not any(k > 1 for k in counts) or len(factors) != seen:
        return []
    it = iter(factors)
    order = [[next(it) for _ in range(k)] for k in _per_step(facts)]
    for step, fs in zip(facts.opt_steps, order, strict=False):
        k = len(step.backwards)
        if k < 2 or any(f is None for f in fs) or len({round(f, 12) for f in fs if f is not None}) != 1:
            continue
        f = fs[0] or 1.0
        return [f"{k} micro-batch losses per optimizer step from {at(step.backwards[0].location)}, each multiplied by "
                f"{f:.4g} before backward(): the accumulated gradient is {k * f:.2f}x the mean of the micro-batch "
                "gradients, what one backward over the full batch gives (1.00x expected for mean losses of equal "
                "micro-batches)"]
    return []


def factors_of_step(factors: list[float | None], facts: AuditFacts, index: int) -> list[float | None]:
    """The constant factors of the backward() calls that fed optimizer step `index` (empty when not all were seen)."""
    seen = sum(1 for e in facts.events if e.kind == "backward")
    if len(factors) != seen:
        return []
    it = iter(factors)
    groups = [[next(it) for _ in range(k)] for k in _per_step(facts)]
    return groups[index] if index < len(groups) else []


def _per_step(facts: AuditFacts) -> list[int]:
    """backward() calls in event order, grouped by the optimizer step they fed (the tail after the last step too)."""
    out, n = [], 0
    for e in facts.events:
        if e.kind == "backward":
            n += 1
        elif e.kind == "optimizer_step":
            out.append(n)
            n = 0
    return out + ([n] if n else [])
