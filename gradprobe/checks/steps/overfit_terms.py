"""The loss's terms at each step of overfit one batch (overfit.py): their values, their lines, the parameters they reach.

The terms are found as the single-step checks find them, never by name: the entries a `train_step` returned (a dict or
a tuple of scalars), else the entries a `loss_fn` returned that gradprobe summed (checks/core/loss_parts.py), else the
additions near the root of the loss that backward() runs on (checks/trace/term_split.py). A light TorchFunctionMode keeps the
scalar values the step computed by their autograd node, with the user line that computed them, so that a term found in
the graph has a value at every step: its value times the constant factor it enters the loss with (a weight, a sign, a
division by the batch size), so that the terms add up to the loss and a term's trend is that of its share of it.
What a term reaches is a walk of its graph to the trainable parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.loss_parts import declared
from gradprobe.checks.steps.facts import at
from gradprobe.checks.trace.term_split import Reach, split_edges
from gradprobe.checks.core.torchcompat import untraced

MAX_BACKWARDS = 4  # backward() calls per step whose loss is split


@dataclass
class StepTerm:
    """One term of one step: its value, the node behind it (None for a number), the user line that computed it."""

    value: float
    node: Any
    location: dict | None


@dataclass
class TermInfo:
    """What the first step measured of a term: its line and the trainable parameters (ids) its graph reaches."""

    location: dict | None
    reached: frozenset[int] = frozenset()


def _float(v: Any) -> float | None:
    if isinstance(v, torch.Tensor) and v.numel() == 1 and (v.is_floating_point() or v.is_complex()):
        return float(v.detach().real.float().item())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


class TermWatch(TorchFunctionMode):
    """During one step: the scalars computed (by autograd node, with their line) and the terms of each backward()."""

    def __init__(self, user: Any) -> None:
        super().__init__()
        self.user = user
        self.scalars: dict[int, tuple[torch.Tensor, dict | None]] = {}
        self.terms: dict[str, StepTerm] = {}
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "backward" and args and isinstance(args[0], torch.Tensor):
            self._split(args[0])
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.grad_fn is not None and out.numel() == 1 \
                and id(out.grad_fn) not in self.scalars:
            self.scalars[id(out.grad_fn)] = (out, self.user.innermost(skip=2))
        return out

    def located(self, node: Any) -> dict | None:
        hit = self.scalars.get(id(node)) if node is not None else None
        return hit[1] if hit is not None else None

    def _split(self, root: torch.Tensor) -> None:
        """The terms of the loss backward() runs on: the entries loss_fn returned, else the sum at the root."""
        self.calls += 1
        if root.numel() != 1 or root.grad_fn is None or self.calls > MAX_BACKWARDS:
            return
        prefix = f"backward {self.calls}: " if self.calls > 1 else ""
        parts = declared(root)
        if parts is not None and not any(v is root for _, v in parts.entries):
            for key, v in parts.entries:
                value = _float(v)
                node = v.grad_fn if isinstance(v, torch.Tensor) else None
                if value is not None:
                    self.terms[f"{prefix}{key}"] = StepTerm(value, node, self.located(node))
            return
        found = split_edges(root.grad_fn)
        if found is None:
            return
        factors = _factors(root, found[0])
        for j, ((node, nr), factor) in enumerate(zip(found[0], factors, strict=True)):
            hit = self.scalars.get(id(node))
            if hit is not None and nr == 0 and factor is not None:
                where = hit[1]
                line = f" ({at(where)})" if where else ""
                value = factor * float(hit[0].detach().real.float().item())
                self.terms[f"{prefix}term {j}{line}"] = StepTerm(value, node, where)


def _factors(root: torch.Tensor, edges: list[tuple[Any, int]]) -> list[float | None]:
    """The constant factor each term enters the loss with (its sign and weight: d loss / d term along the linear nodes
    only), so that a term's value is its share of the loss and the terms add up to it."""
    try:
        with untraced():
            grads = torch.autograd.grad(root, [GradientEdge(n, k) for n, k in edges], retain_graph=True,
                                        allow_unused=True)
    except Exception:  # a graph autograd.grad cannot take apart: no terms (the user's own backward runs as it would)
        return [None] * len(edges)
    return [float(g.detach().real.float().reshape(-1)[0]) if g is not None and g.numel() == 1 else None for g in grads]


def returned_nodes(returned: Any, watch: TermWatch) -> dict[str, StepTerm]:
    """The entries of a dict or tuple a train_step returned, keyed as overfit.returned_terms keys them."""
    items = (list((str(k), v) for k, v in returned.items()) if isinstance(returned, dict) else
             [(f"term {i}", v) for i, v in enumerate(returned)] if isinstance(returned, (tuple, list)) else [])
    out: dict[str, StepTerm] = {}
    for key, v in items:
        value = _float(v)
        if value is not None:
            node = v.grad_fn if isinstance(v, torch.Tensor) else None
            out[key] = StepTerm(value, node, watch.located(node))
    return out


@dataclass
class TermRecord:
    """The terms over the steps: values per step, and what the first step that had each measured of it."""

    values: dict[str, list[float]] = field(default_factory=dict)
    info: dict[str, TermInfo] = field(default_factory=dict)

    def add(self, terms: dict[str, StepTerm], reach: Reach) -> None:
        for key, t in terms.items():
            self.values.setdefault(key, []).append(t.value)
            if key not in self.info:
                self.info[key] = TermInfo(t.location, reach.node(t.node) if t.node is not None else frozenset())


def slope_t(values: list[float]) -> float:
    """The t statistic of the least-squares slope of the values over the steps (0 when they do not vary)."""
    n = len(values)
    if n < 2 or not all(math.isfinite(v) for v in values):
        return 0.0
    xm, ym = (n - 1) / 2, math.fsum(values) / n
    sxx = math.fsum((i - xm) ** 2 for i in range(n))
    slope = math.fsum((i - xm) * (v - ym) for i, v in enumerate(values)) / sxx
    resid = math.fsum((v - ym - slope * (i - xm)) ** 2 for i, v in enumerate(values))
    se = math.sqrt(resid / (n - 2) / sxx) if n > 2 else 0.0
    if se == 0:
        return 0.0 if slope == 0 else math.copysign(math.inf, slope)
    return slope / se
