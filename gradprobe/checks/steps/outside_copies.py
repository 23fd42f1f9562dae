"""EMA copies held outside the model, found by what the script writes into them, never by names or classes.

timm's ModelEmaV2/V3 (a wrapper module holding a deepcopy of the model), diffusers' EMAModel (shadow tensors in a
plain list), torch's AveragedModel and a plain `ema = copy.deepcopy(model)` beside the model all keep the copy where
no attribute of the model reaches it. What they share is what they do after optimizer.step(): an in-place write
(`lerp_`, `mul_().add_()`, `copy_`, `+=`, `torch._foreach_lerp_`) into a floating tensor that is no model parameter,
at a parameter's shape, from a value computed from that parameter (an UpdateWatch's tags, copies.py, or the
parameter's own storage: `model.state_dict()` hands out detached views of it).

`HeldCopies` is a TorchFunctionMode opened from a main step to the next forward, backward or step (the window the
in-model copies' UpdateWatch uses). Each tensor it sees written that way is held (a reference, so the identity stays
valid), with the parameter it follows, the user's line of the write, and its value before that first write: the
interval's movement and the share of its gap to the student it kept (an EMA of decay d keeps d) are measured from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from gradprobe.checks.steps.copies import _SRC, _tag, gap_share
from gradprobe.checks.steps.facts import EmaCopy


@dataclass
class Held:
    """One tensor outside the model written from a model parameter."""

    tensor: torch.Tensor
    student: int  # id of the model parameter it was written from
    student_tensor: torch.Tensor
    site: dict | None  # the user's line of its first write
    before: torch.Tensor | None = None  # its value before its first write in the current interval
    version: int = 0  # its write counter at the start of the current interval (or before its first write)


def _inplace(func: Callable[..., Any]) -> bool:
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.startswith("_") and not name.endswith("__")) or name.startswith("__i") \
        or (name.startswith("_foreach_") and name.endswith("_"))


class HeldCopies(TorchFunctionMode):
    """Open after a main step: tensors outside the model written in place from its parameters (module docstring)."""

    def __init__(self, sources: Iterable[torch.Tensor], model: Iterable[torch.Tensor], held: dict[int, Held],
                 where: Callable[[], dict | None]):
        super().__init__()
        src = list(sources)
        self.shapes: dict[int, torch.Size] = {id(p): p.shape for p in src}
        self.src = {id(p): p for p in src}
        self.by_ptr = {(p.data_ptr(), tuple(p.shape)): id(p) for p in src if p.is_floating_point()}
        self.sizes = {tuple(p.shape) for p in src}
        mine = list(model)
        self.skip = {id(p) for p in mine} | {p.data_ptr() for p in mine} | \
            {p.grad.data_ptr() for p in mine if isinstance(p.grad, torch.Tensor)}
        self.held, self.where = held, where
        self.held_ptr = {(h.tensor.data_ptr(), tuple(h.tensor.shape)): h for h in held.values()}
        self.pending: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, int]] = {}  # freed with the watch

    def _source(self, t: Any) -> frozenset[int]:
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            return frozenset()
        if id(t) in self.shapes:
            return frozenset((id(t),))
        tagged = getattr(t, _SRC, None)
        if tagged:
            return tagged
        if tuple(t.shape) in self.sizes and t.is_floating_point():
            pid = self.by_ptr.get((t.data_ptr(), tuple(t.shape)))
            if pid is not None:
                return frozenset((pid,))
        return frozenset()

    def _sources(self, items: Iterable[Any]) -> frozenset[int]:
        out: frozenset[int] = frozenset()
        for a in items:
            s = self._source(a)
            if s:
                out = out | s
        return out

    def _written(self, dest: Any, srcs: frozenset[int]) -> None:
        """`dest` is about to be written in place from values derived from `srcs`."""
        if type(dest) is not torch.Tensor and not isinstance(dest, torch.nn.Parameter):
            return
        if not dest.is_floating_point() or tuple(dest.shape) not in self.sizes or id(dest) in self.skip \
                or dest.data_ptr() in self.skip:
            return
        key = (dest.data_ptr(), tuple(dest.shape))
        known = self.held_ptr.get(key)  # a view of a held tensor (state_dict() values) is the same tensor
        match = [s for s in srcs if self.shapes[s] == dest.shape]
        if known is None and len(match) != 1:
            # a write not from the model (the `mul_(decay)` before an `add_(p, alpha=1 - decay)`): its value before,
            # in case a write from the model follows in this interval
            self.pending.setdefault(key, (dest.detach().clone(), int(dest._version)))
            return
        if known is None:
            before, version = self.pending.pop(key, (None, int(dest._version)))
            known = Held(dest, match[0], self.src[match[0]], self.where(), before=before, version=version)
            self.held[id(dest)] = self.held_ptr[key] = known
        if known.before is None:
            known.before = dest.detach().clone()

    def _note(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        if not args:
            return
        rest = (*args[1:], *kwargs.values())
        if isinstance(args[0], (list, tuple)):  # a foreach op: element by element
            lists = [a for a in rest if isinstance(a, (list, tuple))]
            scalars = self._sources(a for a in rest if not isinstance(a, (list, tuple)))
            for i, dest in enumerate(args[0]):
                self._written(dest, scalars | self._sources(lst[i] for lst in lists if i < len(lst)))
        else:
            self._written(args[0], self._sources(rest))

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _inplace(func):
            try:
                self._note(func, args, kwargs)
            except Exception:  # only the measurement is given up
                pass
        out = func(*args, **kwargs)
        try:
            if isinstance(out, torch.Tensor) and out.is_floating_point() and not _inplace(func):
                srcs = self._sources((*args, *kwargs.values()))
                if srcs:
                    _tag(out, srcs, self.shapes)
            elif isinstance(out, (list, tuple)) and args and isinstance(args[0], (list, tuple)) and not _inplace(func):
                lists = [a for a in args if isinstance(a, (list, tuple))]
                for i, o in enumerate(out):
                    if isinstance(o, torch.Tensor):
                        _tag(o, self._sources(lst[i] for lst in lists if i < len(lst)), self.shapes)
        except Exception:
            pass
        return out


@dataclass
class HeldInterval:
    """What one interval did to each held tensor."""

    writes: dict[int, int] = field(default_factory=dict)  # id(held tensor) -> in-place writes
    moved: dict[int, bool] = field(default_factory=dict)
    before: dict[int, torch.Tensor] = field(default_factory=dict)  # the value before the interval's first write


def close_interval(held: dict[int, Held]) -> HeldInterval:
    """The interval that ends: each held tensor's writes, whether its value changed, and its value before."""
    out = HeldInterval()
    for hid, h in held.items():
        now = int(h.tensor._version)
        out.writes[hid] = now - h.version
        out.moved[hid] = h.before is not None and not torch.equal(h.before, h.tensor.detach())
        if h.before is not None:
            out.before[hid] = h.before
        h.before, h.version = None, now
    return out


def open_interval(held: dict[int, Held]) -> None:
    """After a main step: the held tensors' values and counters, as the interval's starting point."""
    for h in held.values():
        h.before, h.version = h.tensor.detach().clone(), int(h.tensor._version)


def kept_by_site(held: dict[int, Held], interval: HeldInterval) -> dict[str, float]:
    """Per group of held tensors (one user line writes it): |t1 - s| / |t0 - s| over the interval (copies.gap_share)."""
    groups: dict[str, list[int]] = {}
    for hid, h in held.items():
        if hid in interval.before:
            groups.setdefault(site_key(h.site), []).append(hid)
    out: dict[str, float] = {}
    for key, hids in groups.items():
        share = gap_share([interval.before[i] for i in hids], [held[i].tensor.detach() for i in hids],
                          [held[i].student_tensor.detach() for i in hids])
        if share is not None:
            out[key] = share
    interval.before = {}  # the clones are not kept beyond their interval
    return out


def site_key(site: dict | None) -> str:
    return f"{site['file']}:{site['line']}" if site else "?"


def held_copies(held: dict[int, Held], intervals: list[tuple[HeldInterval, dict[str, float]]], names: dict[int, str],
                ) -> tuple[list[EmaCopy], dict[int, str]]:
    """The held tensors as EMA copies, one per user line that writes them, and names for their tensors. A tensor that
    is a plain copy of its parameter at every step (kept none of its gap: a snapshot) is no EMA and is left out."""
    from gradprobe.checks.steps.facts import at

    groups: dict[str, list[int]] = {}
    for hid, h in held.items():
        groups.setdefault(site_key(h.site), []).append(hid)
    copies, copy_names = [], {}
    for key, hids in groups.items():
        site = held[hids[0]].site
        kept = [k[key] for _, k in intervals if key in k]
        if kept and all(v < 1e-6 for v in kept):  # float32: a full copy keeps ~1e-8
            continue
        students = [held[i].student for i in hids]
        student_names = [names.get(s, "?") for s in students]
        copy = EmaCopy(prefix=f"the copy written at {at(site)}", student=_common(student_names), params=hids,
                       students=students, site=site, held_outside=True)
        copy.moved = [any(iv.moved.get(i, False) for i in hids) for iv, _ in intervals]
        copy.writes = [sum(iv.writes.get(i, 0) for i in hids) for iv, _ in intervals]
        copy.computed = [0 for _ in intervals]
        copy.kept = kept
        copies.append(copy)
        copy_names.update({i: f"{n} (its copy)" for i, n in zip(hids, student_names, strict=True)})
    return copies, copy_names


def _common(names: list[str]) -> str:
    """The module path all the student's tensors share ("" when none: the whole model)."""
    parts = [n.split(".")[:-1] for n in names]
    common: list[str] = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)
