"""Which cut explains each parameter's missing or zero gradient, merged into one cause per code and user line.

After the step, each parameter that was read but got no gradient is attributed to the break
candidates whose input graph reaches it (checks/trace/graphwalk.py), preferring those whose output
reached the loss, then the earliest. A zero gradient is explained by a zero-derivative op, by a
cut already blamed for missing gradients, or by a zero-initialised partner (LoRA B, a closed gate).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from gradprobe.checks.trace.candidates import Candidate, Location, family_of
from gradprobe.checks.trace.graphwalk import reach
from gradprobe.checks.trace.grad_recorder import GradRecorder
from gradprobe.checks.trace.recording import GradTracer


@dataclass
class Cause:
    """One cut blamed for the missing (or zero) gradients of some parameters: the findings' unit."""

    candidate: Candidate
    params: list[nn.Parameter]
    names: list[str] = field(default_factory=list)  # the parameters' names the caller asked about
    chain: list[dict[str, Any]] = field(default_factory=list)  # user lines from the cut back to the first parameter

    @property
    def family(self) -> str:
        return family_of(self.candidate.kind)

    @property
    def where(self) -> Location | None:
        return self.candidate.where()


def _order(loss_tags: frozenset[int]) -> Callable[[Candidate], tuple[bool, bool, bool, int]]:
    def order(c: Candidate) -> tuple[bool, bool, bool, int]:
        # cuts that fed the loss first; a selection by design (argmin -> codebook[idx]: the gradient reaches the
        # codebook through the indexing) after every other cut; then cuts in the user's own code; then the earliest
        return (c.index not in loss_tags, c.selects_for_grad, not c.direct, c.index)
    return order


def blame_cuts(tracer: GradTracer, broken: list[nn.Parameter], zero: list[nn.Parameter], loss_tags: frozenset[int],
               stopped_early: bool) -> dict[int, list[nn.Parameter]]:
    """candidate index -> the parameters whose missing or zero gradient it explains (each parameter once)."""
    targets = {id(p) for p in broken + zero}
    by_cand: dict[int, list[nn.Parameter]] = {}
    if not (targets and tracer.candidates):
        return by_cand
    zero_ids = {id(p) for p in zero}  # identity, never `p in zero` (tensor == compares values)
    reached = reach(tracer.candidates, targets)
    n_bw = len(tracer.backward_calls)
    order = _order(loss_tags)
    for p in broken + zero:
        hits = [c for c in tracer.candidates if id(p) in reached[c.index] and c.can_explain(n_bw)]
        # a zero-derivative op explains a zero gradient, never a missing one
        hits = [c for c in hits if (c.kind == "zero_derivative") == (id(p) in zero_ids)
                and (c.kind == "process" or not stopped_early)]
        if hits:
            by_cand.setdefault(min(hits, key=order).index, []).append(p)
    if not stopped_early:
        _blame_zero_behind_cuts(tracer, zero, reached, loss_tags, by_cand)
    return by_cand


def _blame_zero_behind_cuts(tracer: GradTracer, zero: list[nn.Parameter], reached: dict[int, set[int]],
                            loss_tags: frozenset[int], by_cand: dict[int, list[nn.Parameter]]) -> None:
    """A zero gradient behind a cut: part of the parameter's path is cut and what is left carries zeros (a cast
    that truncated every value), or the parameter consumed the cut's output. Explained by a cut that is already
    blamed for missing gradients, or by one in the user's code that fed the loss nothing but zeros."""
    blamed = set(by_cand)
    first_pass = {id(q) for ps in by_cand.values() for q in ps}
    n_bw = len(tracer.backward_calls)
    order = _order(loss_tags)
    for p in zero:
        if id(p) in first_pass:
            continue
        met = tracer.param_tags.get(id(p), frozenset())
        hits = [c for c in tracer.candidates
                if (id(p) in reached[c.index] or c.index in met) and c.can_explain(n_bw)
                and (c.index in blamed or (c.all_zero and c.direct and c.index in loss_tags and not c.selects_for_grad))]
        if hits:
            by_cand.setdefault(min(hits, key=order).index, []).append(p)


def merge_causes(by_cand: dict[int, list[nn.Parameter]], tracer: GradTracer) -> list[Cause]:
    """One cause per finding: candidates of the same family at the same user line are one cause."""
    merged: dict[tuple[str, Any, Any, str | None], Cause] = {}
    for idx, ps in sorted(by_cand.items()):
        cand = tracer.candidates[idx]
        where = cand.where() or {}
        key = (family_of(cand.kind), where.get("file"), where.get("line"), cand.op if not where else None)
        if key in merged:
            merged[key].params.extend(ps)
        else:
            merged[key] = Cause(cand, list(ps))
    return list(merged.values())


def zero_by_initialisation(zero: list[nn.Parameter], grads: GradRecorder, model: nn.Module, names: dict[int, list[str]],
                           as_bias: Collection[int] = ()) -> dict[int, str]:
    """Zero gradients that initialisation explains: parameter id -> the zero-initialised partner's name.

    A partner was exactly zero before the step and got a nonzero gradient (LoRA B, a closed gate). It
    explains a zero gradient when it sits in the nearest enclosing module that holds other trainable
    parameters, and multiplies rather than adds there: it lives in another submodule (lora_B beside
    lora_A), is a matrix, or is a scalar gate; a zero bias beside its weight, or any parameter an op read as
    its additive bias operand (`as_bias`: a LayerNorm's or a Linear's bias), explains nothing.
    """
    if not zero or not grads.zero_at_start:
        return {}
    trainable = [(names[id(q)][0], q) for q in model.parameters() if q.requires_grad]
    partners = [(n, q) for n, q in trainable if id(q) in grads.zero_at_start
                and id(q) not in as_bias and (g := grads.got.get(id(q))) is not None and not g["zero"] and g["finite"]]
    if not partners:
        return {}
    out: dict[int, str] = {}
    for p in zero:
        hit = _partner_of(p, names[id(p)][0], trainable, partners)
        if hit is not None:
            out[id(p)] = hit
    return out


def _partner_of(p: nn.Parameter, name: str, trainable: list[tuple[str, nn.Parameter]],
                partners: list[tuple[str, nn.Parameter]]) -> str | None:
    owner = name.rpartition(".")[0]
    parts = owner.split(".") if owner else []
    for k in range(len(parts), -1, -1):  # out to the model itself (a gate and a prompt held by the root module)
        prefix = ".".join(parts[:k]) + "." if k else ""
        if not any(n.startswith(prefix) and q is not p for n, q in trainable):
            continue  # nothing else trainable here yet: look one module further out
        return next((n for n, q in partners if n.startswith(prefix) and q is not p
                     and (n.rpartition(".")[0] != owner or q.dim() >= 2 or q.numel() == 1)), None)
    return None
