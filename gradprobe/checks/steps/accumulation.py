"""Gradient accumulation, measured for the all-clear: the constant factor each micro-batch loss was multiplied by
before backward(), and so the accumulated gradient relative to what one backward over the whole batch gives.

`LossFactors` is entered around the observed steps. At each top-level `Tensor.backward()` it reads the loss's graph
from its top: every multiplication or division by a constant (`loss / accum_steps`, `loss * 0.25`), until the first
other operation, multiplied together. With k micro-batches of equal size whose losses are means, backward over the
full batch gives their mean gradient; the accumulated one is k x factor times that (1.00 when each loss is divided
by k, k when none is, 1/k when the division is applied twice).

The observer (observe.py) reads each backward's loss the same way (`loss_scaling`), down to the reduction under the
constants: a mean gives its elements 1 in all, a sum their number (a `reduction="sum"` loss's count or NLL's total
weight). factor x count is what that loss weighs of one mean over all it reduced; over the k losses of one optimizer
step the weights add up to 1.00 when the division by k is applied once (`loss / k` on a mean, a token sum divided by
the whole batch's token count) and to 1/k when it is applied twice (`divided_twice`: GP611 without a full-batch
gradient, in script mode). When a step looks so, the next forward runs in anomaly mode (tracebacks only, no nan
checks) and the next backward's loss gives each scaling operation's line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

from gradprobe.checks.steps.facts import AuditFacts, BackwardCall, LossScaling, OptStep, ScalerStep, at
from gradprobe.userframes import UserCode

_SCALING = {"DivBackward0": -1, "MulBackward0": 1, "DivBackward1": -1, "MulBackward1": 1}
MAX_DEPTH = 16
# a reduction node's `_saved_reduction`: torch's Reduction enum
_MEAN, _SUM = 1, 2


def _constant(t: Any) -> float | None:
    if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.requires_grad:
        return float(t.detach().double().item())
    if isinstance(t, (int, float)):
        return float(t)
    return None


def _scaling_step(node: Any) -> tuple[float, Any] | None:
    """(the constant multiplier, the next node) of a multiplication or division by a constant; None: anything else."""
    power, nexts = _SCALING[node.name()], node.next_functions
    if len(nexts) == 1:  # ...Backward1: the constant is a Python number
        value, nxt = _constant(getattr(node, "_saved_other", None)), nexts[0][0]
    elif len(nexts) == 2 and nexts[1][0] is None:
        value, nxt = _constant(getattr(node, "_saved_other", None)), nexts[0][0]
    elif len(nexts) == 2 and nexts[0][0] is None and power == 1:
        value, nxt = _constant(getattr(node, "_saved_self", None)), nexts[1][0]
    else:
        return None
    if value is None or value == 0:
        return None
    return value ** power, nxt


def _reduction(node: Any) -> tuple[str | None, float | None]:
    """What a reduction gives its elements in total: a mean 1, a sum their number (NLL: its total weight)."""
    name = node.name()
    if name.startswith("MeanBackward"):
        return "mean", 1.0
    reduction = getattr(node, "_saved_reduction", None)
    if reduction == _MEAN:
        return "mean", 1.0
    if reduction == _SUM:
        total = _constant(getattr(node, "_saved_total_weight", None))
        if total is None:
            saved = getattr(node, "_saved_self", None)
            total = float(saved.numel()) if isinstance(saved, torch.Tensor) else None
        return "sum", total
    return ("sum", None) if name.startswith("SumBackward") else (None, None)


def _traced_line(node: Any, user: UserCode) -> tuple[dict | None, bool]:
    """The innermost project line of the forward traceback anomaly mode stored on a node (None: not traced), and
    whether the operation itself ran in a library that line called."""
    for depth, entry in enumerate(reversed(getattr(node, "metadata", {}).get("traceback_") or ())):
        m = _FRAME.match(entry)
        if m and user.is_user_file(m.group(1)):
            return user.location_of(m.group(1), int(m.group(2)), m.group(3)), depth > 0
    return None, False


_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+), in (\S+)')


def loss_scaling(loss: torch.Tensor, user: UserCode | None = None) -> LossScaling:
    """The constant multiplications/divisions at the top of the loss's graph, and the reduction under them (with
    `user`, each operation's line, when anomaly mode recorded the forward's tracebacks)."""
    return scaling_walk(loss, user)[0]


def scaling_walk(loss: torch.Tensor, user: UserCode | None = None,
                 passthrough: tuple[str, ...] = ()) -> tuple[LossScaling, Any]:
    """loss_scaling, and the node under the scaling; nodes named in `passthrough` (a loss passing unchanged through a
    wrapped model's output sink: output k of the node is its k-th input) are walked through."""
    out, node = LossScaling(ops=[]), loss.grad_fn
    output_nr = loss.output_nr  # which output of its node the tensor on the path is (known at the top)
    for _ in range(MAX_DEPTH):
        if node is None:
            break
        if node.name() in passthrough:
            nexts = node.next_functions
            node = nexts[output_nr][0] if output_nr < len(nexts) else None
            output_nr = 0
            continue
        if node.name() not in _SCALING:
            break
        try:
            found = _scaling_step(node)
        except RuntimeError:  # saved values freed (retain_graph=False after an earlier backward)
            found = None
        if found is None:
            break
        out.ops.append(found[0])
        output_nr = next((nr for fn, nr in node.next_functions if fn is found[1]), 0)  # which output of the next node
        if user is not None:
            line, inside = _traced_line(node, user)
            out.lines.append(line)
            out.in_library.append(inside)
        node = found[1]
    if node is not None:
        out.stopped_at = node.name()
        try:
            out.reduction, out.count = _reduction(node)
        except RuntimeError:
            pass
    return out, node


def loss_factor(loss: torch.Tensor) -> float:
    """The product of the constant multiplications/divisions at the top of the loss's graph (1.0: none)."""
    return loss_scaling(loss).factor


@dataclass
class DividedTwice:
    """k micro-batch losses each scaled by 1/k whose masses add up to 1/k of one mean over the whole batch."""

    k: int
    mass: float  # the sum over the micro-batches of factor x count (1.0: the division by k applied once)
    scalings: list[LossScaling]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def divided_twice(backwards: list[BackwardCall], scale: float | None = None,
                  low: float = 0.75, high: float = 1.33) -> DividedTwice | None:
    """The measured case of a division by k applied twice, from the k losses' graphs (`scale`: a GradScaler's scale,
    one multiplication by it left out), or None. Each loss must carry a multiplication by exactly 1/k and a reduction
    whose weight is known; their masses must add up to 1/k (within [low, high] of it)."""
    k = len(backwards)
    if k < 2:
        return None
    scalings, mass = [], 0.0
    for b in backwards:
        s = b.scaling
        if s is None or s.count is None:
            return None
        ops = list(s.ops)
        if scale:
            ops = _without(ops, scale)
        if not any(_close(v, 1 / k) for v in ops):
            return None
        mass += math.prod(ops) * s.count
        scalings.append(s)
    return DividedTwice(k=k, mass=mass, scalings=scalings) if low <= mass * k <= high else None


def divided_twice_at(step: OptStep, scaler_steps: list[ScalerStep]) -> DividedTwice | None:
    """divided_twice for one optimizer step (not when zero_grad() ran between its micro-batches or its gradients were
    never cleared), with each GradScaler scale seen tried as the one multiplication to leave out."""
    bw = step.backwards
    if any(0 < n < len(bw) for _, n in step.zero_grads_between) or (bw and bw[0].stale):
        return None
    scales = [None, *sorted({s.scale for s in scaler_steps if s.scale})]
    return next((f for s in scales if (f := divided_twice(bw, s)) is not None), None)


def described(found: DividedTwice, step: OptStep) -> tuple[dict | None, dict[str, Any], dict[str, Any]]:
    """GP611's graph situation: its location (the division to remove, else the backward() line), evidence, fields."""
    bw = step.backwards
    first = found.scalings[0]
    traced = next((s for s in found.scalings if s.lines), first)
    remove = _remove_location(traced, found.k)
    reduction = f"mean ({first.stopped_at})" if first.reduction == "mean" else \
        f"sum over {first.count:g} elements ({first.stopped_at})"
    evidence = {"micro_batches": found.k, "mass": round(found.mass, 6),
                "losses": [{"multipliers": s.ops, "reduction": s.reduction, "reduced_by": s.stopped_at, "count": s.count,
                            "lines": [at(x) if x else None for x in s.lines]} for s in found.scalings]}
    fields = {"k": found.k, "line": at(bw[0].location), "step_line": at(step.location), "reduction": reduction,
              "ops": ", ".join(_op_text(v, traced, i) for i, v in enumerate(first.ops) if v != 1.0), "mass": found.mass,
              "remove": at(remove) if remove else f"{at(bw[0].location)} or where the loss is computed"}
    return remove or bw[0].location, evidence, fields


def _op_text(value: float, s: LossScaling, i: int) -> str:
    text = f"{value:.4g}" + (f" (1/{1 / value:.4g})" if 0 < value < 1 else "")
    if i < len(s.lines) and s.lines[i]:
        text += f" at {at(s.lines[i])}" + (" (inside the library call there)" if s.in_library[i] else "")
    return text


def _remove_location(s: LossScaling, k: int) -> dict | None:
    """The division by k to remove: the project's own when a library divides too, else the outer one."""
    mine = [(line, lib) for v, line, lib in zip(s.ops, s.lines, s.in_library, strict=False)
            if line and abs(v * k - 1) < 1e-6]
    own = [line for line, lib in mine if not lib]
    return own[0] if own and len(own) < len(mine) else (mine[0][0] if mine else None)


def mass_text(step: OptStep, scaler_steps: list[ScalerStep]) -> str:
    """For the all-clear: what the k losses of a step weigh together, read from their graphs ("" when not known)."""
    scaled = [b.scaling for b in step.backwards]
    if len(scaled) < 2 or any(s is None or s.count is None for s in scaled):
        return ""
    scales = sorted({s.scale for s in scaler_steps if s.scale})
    masses = [math.prod(_without(s.ops, scales[-1]) if scales else s.ops) * (s.count or 0.0)
              for s in scaled if s is not None]
    return (f"; read from the losses' graphs, the {len(scaled)} losses weigh {sum(masses):.3f} of one mean over the "
            "whole batch (1.00: divided by the number of micro-batches once)")


def _without(ops: list[float], value: float) -> list[float]:
    for i, v in enumerate(ops):
        if _close(v, value):
            return ops[:i] + ops[i + 1:]
    return ops


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
    from gradprobe.checks.steps.gradients import one_loss_in_parts

    for step, fs in zip(facts.opt_steps, order, strict=False):
        k = len(step.backwards)
        if k < 2 or any(f is None for f in fs) or len({round(f, 12) for f in fs if f is not None}) != 1:
            continue
        if one_loss_in_parts(step):  # one loss computed in parts: k x factor is not its ratio to one batch
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
