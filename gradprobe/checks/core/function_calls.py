"""Watch calls of user-defined torch.autograd.Function subclasses during a step.

The tracer needs to know when it is inside a custom Function's forward (where
grad mode is off by design, so nothing there is a "break"), and gradcheck needs
the real inputs each Function received. One patch serves both; it sits where
`Function.apply` resolves its `super().apply(...)` at call time (see
torchcompat.custom_function_entry), so an alias bound at import (`square = Square.apply`)
cannot escape it. `backward_lines` says where a Function's backward sits in the source (its def and its
return line): the gradcheck family's GP4xx locations and the trace family's GP120.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

import torch

from gradprobe.checks.core.torchcompat import custom_function_entry, untraced
from gradprobe.userframes import location

MAX_CALLS_PER_FN = 64  # parameter positions are recorded for the first calls of each Function
MAX_GRAPH_NODES = 4000  # graph nodes walked per input to name the parameters upstream of it
_state = threading.local()
_watchers: list[ApplyWatch] = []
_ENTRY_OWNER, _ENTRY_NAME, _C_APPLY = custom_function_entry()


MAX_HOPS = 6
# graph nodes that pass one tensor through as a cast, a view or a copy (what `self.weight` becomes on its way in)
PASS_NODES = frozenset({
    "ToCopyBackward0", "ViewBackward0", "TBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0",
    "ExpandBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2",
    "CloneBackward0", "AliasBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "ContiguousBackward0",
    "ViewAsRealBackward0", "NumpyTBackward0",
})


def weight_like(a: Any, param_ids: Mapping[int, Any]) -> bool:
    """A parameter itself, or a chain of casts/views of exactly one parameter (not an activation computed from it)."""
    if not isinstance(a, torch.Tensor) or not a.is_floating_point():
        return False
    if id(a) in param_ids:
        return True
    node, hops = a.grad_fn, 0
    while node is not None and hops <= MAX_HOPS:
        kind = type(node).__name__
        if kind == "AccumulateGrad":
            return id(getattr(node, "variable", None)) in param_ids
        if kind not in PASS_NODES:
            return False
        nxt = [fn for fn, _ in node.next_functions if fn is not None]
        if len(nxt) != 1:
            return False
        node, hops = nxt[0], hops + 1
    return False


def inside_custom_function() -> bool:
    return getattr(_state, "depth", 0) > 0


def _snapshot(args: tuple[Any, ...]) -> tuple[Any, ...]:
    with untraced():  # our own copies are not the user's ops: keep them out of traces
        return _copy(args)


def _copy(args: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone()
            c.requires_grad_(a.requires_grad and (a.is_floating_point() or a.is_complex()))
            out.append(c)
        else:
            out.append(a)
    return tuple(out)


def _watched_apply_fn(cls: type, *args: Any, **kwargs: Any) -> Any:
    apply = _C_APPLY.__get__(None, cls)
    if not _watchers or cls.__module__.startswith("torch."):
        return apply(*args, **kwargs)
    for w in _watchers:
        w.record(cls, args)
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        out = apply(*args, **kwargs)
    finally:
        _state.depth -= 1
    for w in _watchers:
        if w.on_return is not None:
            w.on_return(cls, args, out)
    return out


_watched_apply: Any = classmethod(_watched_apply_fn)


class ApplyWatch:
    """Context manager: records (Function class, input snapshot, parameter ids per position)."""

    def __init__(self, user: Any = None, param_ids: dict[int, str] | None = None, capture: bool = True,
                 on_return: Callable[[type, tuple[Any, ...], Any], None] | None = None) -> None:
        self.user = user
        self.on_return = on_return  # called with (Function class, inputs, output) after each apply
        self.param_ids = param_ids or {}
        self.capture = capture
        self.max_calls = MAX_CALLS_PER_FN
        self.calls: dict[type, dict[str, Any]] = {}
        self.read: set[int] = set()

    def record(self, cls: type, args: tuple[Any, ...]) -> None:
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
                # positions that are a parameter (or a cast/view of one): gradcheck also checks them moved (GP401)
                "weights_at": [i for i, a in enumerate(args) if weight_like(a, self.param_ids)],
            }
        entry["count"] += 1
        if entry["count"] <= self.max_calls:
            for i, a in enumerate(args):
                if not isinstance(a, torch.Tensor):
                    continue
                found = [self.param_ids[id(a)]] if id(a) in self.param_ids else []
                if self.capture and a.grad_fn is not None:
                    found += self._upstream_params(a.grad_fn)
                for n in found:
                    names = entry["params_at"].setdefault(i, [])
                    if n not in names:
                        names.append(n)

    def _upstream_params(self, root: Any) -> list[str]:
        """The model parameters whose gradients flow through this input: the leaves of its graph, nearest first."""
        out: list[str] = []
        seen: set[int] = set()
        queue = [root]
        while queue and len(seen) < MAX_GRAPH_NODES:
            nxt = []
            for node in queue:
                if id(node) in seen:
                    continue
                seen.add(id(node))
                var = getattr(node, "variable", None)  # AccumulateGrad: a leaf tensor
                if isinstance(var, torch.Tensor) and id(var) in self.param_ids:
                    out.append(self.param_ids[id(var)])
                nxt += [fn for fn, _ in node.next_functions if fn is not None]
            queue = nxt
        return out

    def __enter__(self) -> ApplyWatch:
        if not _watchers:
            setattr(_ENTRY_OWNER, _ENTRY_NAME, _watched_apply)
        _watchers.append(self)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        _watchers.remove(self)
        if not _watchers:
            delattr(_ENTRY_OWNER, _ENTRY_NAME)  # _SingleLevelFunction defines no apply of its own
        return False


Loc = dict[str, Any]


def backward_lines(cls: type) -> tuple[Loc | None, Loc | None]:
    """(def line, last return line) of cls.backward as locations."""
    fn = cls.__dict__.get("backward")
    fn = getattr(fn, "__func__", fn)
    if fn is None:
        return None, None
    try:
        lines, start = inspect.getsourcelines(fn)  # start is the first decorator's line
        filename = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None, None
    filename = cast(str, filename)  # getsourcelines found the source, so it has a file
    name = f"{cls.__name__}.backward"
    def_offset = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def ")), 0)
    def_loc = location(filename, start + def_offset, name)
    try:
        rets = [n.lineno for n in ast.walk(ast.parse(textwrap.dedent("".join(lines)))) if isinstance(n, ast.Return)]
    except SyntaxError:
        rets = []
    return def_loc, (location(filename, start + max(rets) - 1, name) if rets else None)
