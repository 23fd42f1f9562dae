"""Watch calls of user-defined torch.autograd.Function subclasses during a step.

The tracer needs to know when it is inside a custom Function's forward (where
grad mode is off by design, so nothing there is a "break"), and gradcheck needs
the real inputs each Function received. One patch of `Function.apply` serves both.
"""

from __future__ import annotations

import threading

import torch
from torch.autograd.function import Function

from gradprobe.checks.torchcompat import custom_function_apply, untraced

MAX_CALLS_PER_FN = 64  # parameter positions are recorded for the first calls of each Function
_state = threading.local()
_watchers: list[ApplyWatch] = []
_original_apply = custom_function_apply()


def inside_custom_function() -> bool:
    return getattr(_state, "depth", 0) > 0


def _snapshot(args):
    with untraced():  # our own copies are not the user's ops: keep them out of traces
        return _copy(args)


def _copy(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone()
            c.requires_grad_(a.requires_grad and (a.is_floating_point() or a.is_complex()))
            out.append(c)
        else:
            out.append(a)
    return tuple(out)


def _watched_apply_fn(cls, *args, **kwargs):
    if not _watchers or cls.__module__.startswith("torch."):
        return _original_apply.__func__(cls, *args, **kwargs)
    for w in _watchers:
        w.record(cls, args)
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        return _original_apply.__func__(cls, *args, **kwargs)
    finally:
        _state.depth -= 1


_watched_apply = classmethod(_watched_apply_fn)


class ApplyWatch:
    """Context manager: records (Function class, input snapshot, parameter ids per position)."""

    def __init__(self, user=None, param_ids: dict | None = None, capture: bool = True):
        self.user = user
        self.param_ids = param_ids or {}
        self.capture = capture
        self.max_calls = MAX_CALLS_PER_FN
        self.calls: dict[type, dict] = {}
        self.read: set[int] = set()

    def record(self, cls, args):
        entry = self.calls.get(cls)
        for a in args:
            if isinstance(a, torch.Tensor) and id(a) in self.param_ids:
                self.read.add(id(a))
        if entry is None:
            entry = self.calls[cls] = {
                "inputs": _snapshot(args) if self.capture else None,
                "count": 0,
                "params_at": {},
                "location": self.user.innermost(skip=3) if self.user else None,
            }
        entry["count"] += 1
        if entry["count"] <= self.max_calls:
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor) and id(a) in self.param_ids:
                    names = entry["params_at"].setdefault(i, [])
                    n = self.param_ids[id(a)]
                    if n not in names:
                        names.append(n)

    def __enter__(self):
        if not _watchers:
            Function.apply = _watched_apply
        _watchers.append(self)
        return self

    def __exit__(self, *exc):
        _watchers.remove(self)
        if not _watchers:
            Function.apply = _original_apply
        return False
