"""Why a compiled module's gradients differ from eager (GP701's explanation), measured with dynamo's own output.

Once GP701's comparison names parameters, the eager module is traced again, fresh, with a recording backend
(aot_eager behind it): dynamo hands each FX graph it captures to the backend, with the real tensors it will be
called with (parameters are graph inputs, matched to the model's by identity), each node's `stack_trace` (the
user's line that produced the op) and, on a graph that ends at a graph break, `compile_subgraph_reason` (the
reason and the user's frames; what `torch._dynamo.explain` reports). The user's compiled module keeps its own
cache: a second backend makes dynamo add an entry, not replace one.

- The fresh trace gives eager's gradients: the graph the user's module runs was traced before a change dynamo does
  not guard on (hooks: `torch._dynamo.config.skip_nnmodule_hook_guards`, pytorch/pytorch#117758, #115750). A hook
  whose code the fresh graph holds is named, with the hook's line.
- The fresh trace differs too: the line where eager uses a parameter the compiled graphs never read (a branch on
  `torch.compiler.is_compiling()`, a value captured at trace time), and the graph breaks with their reasons; where
  every parameter is read, the first op whose value or gradient the backend computes differently from the same
  graph run in eager (compiled_ops.py), with its line.

The fresh trace uses the backend the user's module was compiled with, so a backend's own difference is not taken
for a stale graph.
"""

from __future__ import annotations

import copy
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks.compiled.compiled_ops import Backend, first_differing_op
from gradprobe.userframes import UserCode, location

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
_HOOK_DICTS = (("forward hook", "_forward_hooks"), ("forward pre-hook", "_forward_pre_hooks"),
               ("backward hook", "_backward_hooks"), ("backward pre-hook", "_backward_pre_hooks"))

Frame = tuple[str, int, str]  # file, line, function


@dataclass
class Recorded:
    """What the recording backend saw: each graph with the tensors it was first called with."""

    compiler: Backend
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = field(default_factory=list)
    reasons: list[Any] = field(default_factory=list)  # dynamo's GraphCompileReason of each graph

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append((copy.deepcopy(gm), list(example_inputs)))  # a backend's passes may rewrite `gm` in place
        self.reasons.append(getattr(gm, "compile_subgraph_reason", None))  # (a deep copy drops it)
        return self.compiler(gm, example_inputs)


def user_backend(wrapper: nn.Module) -> Backend:
    """The backend the user's compiled module was built with (dynamo keeps it behind its frame callbacks);
    aot_eager when it cannot be found (script mode compiles afresh with aot_eager anyway)."""
    from torch._dynamo.backends.debugging import aot_eager

    obj = getattr(getattr(wrapper, "dynamo_ctx", None), "callback", None)
    for _ in range(6):
        if obj is None or not type(obj).__module__.startswith("torch._dynamo.convert_frame"):
            break
        obj = getattr(obj, "_torchdynamo_orig_backend", None)
    return cast(Backend, obj) if callable(obj) else aot_eager


@dataclass
class Why:
    """The explanation's facts (JSON-ready but `hook` and locations)."""

    fresh_agrees: bool  # a fresh trace of the same module gives eager's gradients for every named parameter
    hook: dict[str, Any] | None = None  # {"kind", "function", "module", "location"}: a hook whose code the fresh graph runs
    unread: dict[str, dict[str, Any]] = field(default_factory=dict)  # parameter -> where eager uses it; no graph reads it
    breaks: list[dict[str, Any]] = field(default_factory=list)  # {"reason", "location"} per graph break, in order
    graphs: int = 0
    op: dict[str, Any] | None = None  # {"op", "graph", "location"}: the first op the backend computes differently

    def as_dict(self) -> dict[str, Any]:
        return {"fresh_trace_agrees": self.fresh_agrees, "graphs": self.graphs, "hook": self.hook,
                "unread_by_graph": self.unread, "graph_breaks": self.breaks[:10], "first_differing_op": self.op}


def _frames(stack_trace: str | None) -> list[Frame]:
    return [(m["file"], int(m["line"]), m["fn"]) for m in _FRAME.finditer(stack_trace or "")]


def _pick(frames: list[Frame], user: UserCode) -> Frame | None:
    """The innermost of the user's frames (the innermost outside torch when the project is unknown)."""
    mine = [f for f in frames if user.is_user_file(f[0])]
    if not mine:
        mine = [f for f in frames if "site-packages" not in f[0] and not f[0].startswith("<")]
    return mine[-1] if mine else None


def _hooks(model: nn.Module) -> Iterator[tuple[str, str, Any]]:
    """(kind, module name, the hook's code object) of every hook registered on the model's modules now."""
    for mname, mod in model.named_modules():
        for kind, attr in _HOOK_DICTS:
            for fn in getattr(mod, attr, {}).values():
                code = getattr(getattr(fn, "func", fn), "__code__", None)
                if code is not None:
                    yield kind, mname or "the model", code


def _hook_in_graphs(rec: Recorded, model: nn.Module) -> dict[str, Any] | None:
    """The first graph node whose stack passes through a hook registered on the model now."""
    hooks = list(_hooks(model))
    for gm, _ in rec.graphs:
        for node in gm.graph.nodes:
            for f in reversed(_frames(node.meta.get("stack_trace"))):
                for kind, mname, code in hooks:
                    if f[0] == code.co_filename and f[2] == code.co_name and f[1] >= code.co_firstlineno:
                        return {"kind": kind, "function": code.co_name, "module": mname,
                                "location": location(f[0], f[1], f[2])}
    return None


def _read_by_graphs(rec: Recorded) -> set[int]:
    """ids of the tensors some captured graph reads (a graph input with at least one user)."""
    read: set[int] = set()
    for gm, inputs in rec.graphs:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        read |= {id(t) for n, t in zip(placeholders, inputs, strict=False) if isinstance(t, torch.Tensor) and n.users}
    return read


def _breaks(rec: Recorded, user: UserCode) -> list[dict[str, Any]]:
    out = []
    for reason in rec.reasons:
        if reason is None or not getattr(reason, "graph_break", False):
            continue
        stack = [(f.filename, int(f.lineno or 0), f.name) for f in getattr(reason, "user_stack", []) or []]
        f = _pick(stack, user)
        out.append({"reason": str(reason.reason)[:300], "location": location(*f) if f else None})
    return out


class _ParamUse(TorchFunctionMode):
    """The user's line of the first torch call that takes each watched parameter (by identity) in eager."""

    def __init__(self, watched: dict[int, str], user: UserCode) -> None:
        super().__init__()
        self.watched, self.user = watched, user
        self.first: dict[str, Frame] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for a in (*args, *kwargs.values()):
            name = self.watched.get(id(a)) if isinstance(a, torch.Tensor) else None
            if name is not None and name not in self.first:
                f = _pick([(s.filename, int(s.lineno or 0), s.name) for s in traceback.extract_stack()], self.user)
                if f is not None:
                    self.first[name] = f
        return func(*args, **kwargs)


def eager_uses(run: Callable[[], Any], watched: dict[int, str], user: UserCode) -> dict[str, Frame]:
    """Run the eager step once with the parameter watch on."""
    mode = _ParamUse(watched, user)
    with mode:
        run()
    return mode.first


def explain(eager: nn.Module, named: dict[str, nn.Parameter], fresh_grads: Callable[[nn.Module], list[Any]],
            eager_run: Callable[[], Any], agrees: Callable[[list[Any]], bool], user: UserCode,
            backend: Backend) -> Why:
    """Trace `eager` afresh with `backend` behind the recorder; `fresh_grads(module)` runs the step, `agrees` judges
    it against eager's gradients."""
    rec = Recorded(backend)
    fresh = cast(nn.Module, torch.compile(eager, backend=rec.backend))
    why = Why(fresh_agrees=agrees(fresh_grads(fresh)))
    why.graphs = len(rec.graphs)
    why.breaks = _breaks(rec, user)
    if why.fresh_agrees:
        why.hook = _hook_in_graphs(rec, eager)
        return why
    read = _read_by_graphs(rec)
    unread = {id(p): n for n, p in named.items() if id(p) not in read}
    if unread:
        why.unread = {n: location(*f) for n, f in eager_uses(eager_run, unread, user).items()}
    if not why.unread:
        why.op = _first_op(rec, backend, user)
    return why


def _first_op(rec: Recorded, backend: Backend, user: UserCode) -> dict[str, Any] | None:
    found = first_differing_op(rec.graphs, backend)
    if found is None:
        return None
    i, node = found
    f = _pick(_frames(node.meta.get("stack_trace")), user)
    target = node.target
    op = getattr(target, "__name__", None) or str(target)
    return {"op": op, "graph": i + 1, "location": location(*f) if f else None}
