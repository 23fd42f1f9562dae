"""What the steps do to a model's copies (EMA/momentum teachers, frozen reference models), measured, never named.

Three measurements, each from what the code does between the steps:
- writes: a tensor's version counter (`p._version`) goes up on every in-place write (`mul_`, `add_`, `lerp_`,
  `copy_`); a copy written at every step that still never changes has an update that changes nothing (a decay of 1,
  the copy copied onto itself);
- updates computed out of place: a small TorchFunctionMode follows, by identity, the tensors derived from each
  parameter at that parameter's shape; an op that combines a copy's parameter with its paired student's
  (`t = d * t + (1 - d) * s`) computed an EMA update, whose result a rebound name may then drop;
- a parameter in the optimizer that is also moved outside it toward a paired twin: right after optimizer.step() its
  gap to the twin is saved, and the share of that gap the outside write keeps is measured (an EMA keeps its decay,
  the same share at every step; a clipping or a weight normalisation does not move it toward a twin).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import math
from typing import Any

import torch
import torch.nn as nn
import torch.optim.optimizer as optimizer_mod
from torch.overrides import TorchFunctionMode

_SRC = "_gradprobe_param_src"


def versions(params: Iterable[torch.Tensor]) -> dict[int, int]:
    """Each parameter's in-place write counter."""
    return {id(p): int(p._version) for p in params}


def _sources(t: Any, params: dict[int, torch.Size]) -> frozenset[int]:
    if not isinstance(t, torch.Tensor):
        return frozenset()
    if id(t) in params:
        return frozenset((id(t),))
    return getattr(t, _SRC, frozenset())


def _union(args: tuple, kwargs: dict | None, params: dict[int, torch.Size]) -> frozenset[int]:
    """The parameters the tensor arguments of one op derive from."""
    found: frozenset[int] = frozenset()
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            s = _sources(a, params)
            if s:
                found = found | s if found else s
    return found


def _tag(out: Any, srcs: frozenset[int], params: dict[int, torch.Size]) -> None:
    if not srcs or type(out) is not torch.Tensor or id(out) in params:
        return
    keep = frozenset(s for s in srcs if params[s] == out.shape)
    if keep:
        try:
            setattr(out, _SRC, keep)
        except (AttributeError, RuntimeError):
            pass


class UpdateWatch(TorchFunctionMode):
    """Open around each observed call: which pairs of parameters an op combined at a parameter's shape."""

    def __init__(self, params: Iterable[torch.Tensor]):
        super().__init__()
        self.shapes: dict[int, torch.Size] = {id(p): p.shape for p in params}
        self.combined: set[tuple[int, int]] = set()

    def _note(self, srcs: frozenset[int], shape: torch.Size) -> None:
        if len(srcs) < 2:
            return
        at_shape = [s for s in srcs if self.shapes[s] == shape]
        self.combined.update((a, b) for a in at_shape for b in at_shape if a != b)

    def _per_index(self, args: tuple, out: Any) -> None:
        """A foreach op (lists of tensors): sources element by element."""
        lists = [a for a in args if isinstance(a, (list, tuple))]
        outs = out if isinstance(out, (list, tuple)) else lists[0]
        for i, o in enumerate(outs):
            srcs = frozenset().union(*(_sources(lst[i], self.shapes) for lst in lists if i < len(lst)))
            if isinstance(o, torch.Tensor):
                self._note(srcs, o.shape)
                _tag(o, srcs, self.shapes)

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        try:
            if args and isinstance(args[0], (list, tuple)):
                self._per_index(args, out)
            elif isinstance(out, torch.Tensor):
                srcs = _union(args, kwargs, self.shapes)
                if srcs:  # none: nothing to note or tag (the common case, kept cheap: this runs for every op)
                    self._note(srcs, out.shape)
                    _tag(out, srcs, self.shapes)
        except Exception:  # the user's op ran; only the measurement is given up
            pass
        return out


def twins(model: nn.Module, names: dict[int, str], candidates: set[int], pool: set[int]) -> dict[int, int]:
    """For each candidate parameter, the one other parameter in `pool` with the same relative name and shape."""
    by_id = {id(p): p for p in model.parameters()}
    named = {names[i]: i for i in pool if i in names and i in by_id}
    out: dict[int, int] = {}
    for pid in candidates:
        name = names.get(pid)
        if name is None or pid not in by_id:
            continue
        parts = name.split(".")
        for k in range(1, len(parts)):
            suffix = ".".join(parts[k:])
            hits = [i for o, i in named.items() if i != pid and (o == suffix or o.endswith("." + suffix))
                    and by_id[i].shape == by_id[pid].shape]
            if len(hits) == 1:
                out[pid] = hits[0]
                break
    return out


class AfterStep:
    """Saves the candidates' and their twins' values at every optimizer.step() post-hook of one observed call."""

    def __init__(self, model: nn.Module, pairs: dict[int, int]):
        self.pairs = pairs
        by_id = {id(p): p for p in model.parameters()}
        self.params = {i: by_id[i] for pair in pairs.items() for i in pair if i in by_id}
        self.saved: dict[int, torch.Tensor] = {}
        self._handle: Any = None

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.saved = {i: p.detach().clone() for i, p in self.params.items()}

    def __enter__(self) -> AfterStep:
        self.saved = {}
        if self.pairs:
            self._handle = optimizer_mod.register_optimizer_step_post_hook(self._post)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def kept(self) -> dict[int, float]:
        """Per candidate: |t_end - s_end| / |t_after_step - s_end| (an EMA of decay d keeps d of the gap)."""
        out: dict[int, float] = {}
        for t, s in self.pairs.items():
            if t not in self.saved or s not in self.params:
                continue
            end_t, end_s = self.params[t].detach(), self.params[s].detach()
            gap0 = float((self.saved[t] - end_s).norm())
            if gap0 > 0 and not torch.equal(self.saved[t], end_t):
                out[t] = float((end_t - end_s).norm()) / gap0
        self.saved = {}
        return out


def constant_share(kept: list[float]) -> bool:
    """Moved toward the twin by the same share at every measured step: an EMA update."""
    return bool(kept) and all(0 < k < 1 for k in kept) and max(kept) - min(kept) <= 1e-2 * max(kept)


def kept_share(copy: Any, before: list[torch.Tensor], by_id: dict[int, torch.Tensor]) -> float | None:
    """|teacher - student| after the copy's update over the same before it (an EMA of decay d keeps d of its gap);
    None when the copy's tensors are gone or the gap was 0."""
    t1 = [by_id[i].detach() for i in copy.params if i in by_id]
    s1 = [by_id[i].detach() for i in copy.students if i in by_id]
    if len(t1) != len(before) or len(s1) != len(t1):
        return None
    return gap_share(before, t1, s1)


def gap_share(before: list[torch.Tensor], after: list[torch.Tensor], students: list[torch.Tensor]) -> float | None:
    """|after - student| over |before - student|, over all the tensors (None when the gap before was 0)."""
    from gradprobe.checks.steps.observe import norms

    gap1 = math.sqrt(math.fsum(v * v for v in norms(torch._foreach_sub(after, students))))
    gap0 = math.sqrt(math.fsum(v * v for v in norms(torch._foreach_sub(before, students))))
    return gap1 / gap0 if gap0 > 0 else None
