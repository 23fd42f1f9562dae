"""From a captured script step to a loaded target the checks can run on.

- the model: of the modules alive at the step (found with `gc`), the outermost ones; the one
  holding most of the stepping optimizer's parameters and of the leaves of the backpropagated
  loss's graph wins. A library wrapper with one child and no parameters of its own
  (DistributedDataParallel, a compiled module) is unwrapped, so names have no `module.` prefix.
- the step the checks replay: the model's own recorded call (its arguments as the script
  passed them) and a loss taken from its output the way the script's loss was: the output
  tensor the script backpropagated from, else the outputs its loss was computed from. When
  the model itself was never called (a Lightning `training_step` calls its submodules), the
  user's method that made the calls is called again with its recorded arguments.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import floating_outputs
from gradprobe.scriptmode.observe import Backward, ModuleCall, StepWatch
from gradprobe.userframes import UserCode
from gradprobe.wrappers import unwrap_library

_PROJECTION_SEED = 1234


@dataclass
class Replay:
    model: nn.Module
    batch: Any
    loss_fn: Callable | None
    train_step: Callable | None
    facts: dict
    wrapper: nn.Module | None = None  # the library wrapper (compiled, DDP) the script called, if any


def graph_leaves(roots: list[torch.Tensor], limit: int = 200_000) -> tuple[set[int], set[int], dict[int, torch.Tensor]]:
    """(ids of grad_fn nodes, ids of leaf tensors, id -> leaf) of the graphs behind `roots`."""
    nodes: set[int] = set()
    leaves: dict[int, torch.Tensor] = {}
    stack = [r.grad_fn for r in roots if r is not None and r.grad_fn is not None]
    for r in roots:
        if r is not None and r.grad_fn is None and r.requires_grad:
            leaves[id(r)] = r
    while stack and len(nodes) < limit:
        node = stack.pop()
        if node is None or id(node) in nodes:
            continue
        nodes.add(id(node))
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor):
            leaves[id(var)] = var
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None:
                stack.append(nxt)
    return nodes, set(leaves), leaves


def _params(m: nn.Module) -> list[nn.Parameter]:
    return list(m.parameters())


def _library_class(m: nn.Module, user: UserCode) -> bool:
    import inspect

    # the file of the class's own code first: a class of a script run as __main__ is no longer found through
    # sys.modules["__main__"] once the script has ended (inspect.getfile would name gradprobe's own main)
    code = next((f.__code__ for f in vars(type(m)).values() if hasattr(f, "__code__")), None)
    if code is not None:
        return not user.is_user_file(code.co_filename)
    try:
        return not user.is_user_file(inspect.getfile(type(m)))
    except (TypeError, OSError):
        return True


def unwrap(m: nn.Module, user: UserCode) -> nn.Module:
    """Step inside library wrappers that only hold one child with all the parameters."""
    for _ in range(4):
        kids = list(m.children())
        own = [p for p in m._parameters.values() if p is not None]
        if len(kids) != 1 or own or not _library_class(m, user):
            return m
        inner = kids[0]
        if {id(p) for p in _params(inner)} != {id(p) for p in _params(m)}:
            return m
        m = inner
    return m


def outermost_modules() -> list[nn.Module]:
    # type(), not isinstance(): a dead weakref.proxy among gc's objects (torch.compile leaves some)
    # raises ReferenceError on any attribute access, __class__ included
    from gradprobe.modelset import ModelSet

    # a ModelSet of gradprobe's own (several models checked as one) holds the user's models, it is none of them
    mods = [o for o in gc.get_objects() if issubclass(type(o), nn.Module) and not issubclass(type(o), ModelSet)]
    inner: set[int] = set()
    for m in mods:
        for c in m.children():
            inner.add(id(c))
    return [m for m in mods if id(m) not in inner]


def choose_model(watch: StepWatch, in_opt: set[int], in_graph: set[int], user: UserCode,
                 outer: list[nn.Module] | None = None) -> tuple[nn.Module | None, dict]:
    """The outermost module holding most of the optimizer's parameters, then of the loss graph's
    leaves; ties go to the one called last, then to the smaller one. `outer`: outermost_modules(), when the caller
    has walked the live objects already."""
    from gradprobe.sharded import unsharded_to_sharded  # FSDP2: the graph's leaves are the unsharded parameters

    last_call = {mid: c.seq for mid, c in watch.calls.items()}
    best, best_key = None, None
    seen: set[int] = set()
    for root in outermost_modules() if outer is None else outer:
        m = unwrap(root, user)
        if id(m) in seen:
            continue
        seen.add(id(m))
        ids = {id(p) for p in _params(m)}
        opt_score, graph_score = len(ids & in_opt), len((ids | set(unsharded_to_sharded(m))) & in_graph)
        if opt_score == 0 and graph_score == 0:
            continue
        called = max(last_call.get(id(root), 0), last_call.get(id(m), 0))
        key = (opt_score, graph_score, called, -len(ids))
        if best_key is None or key > best_key:
            best, best_key = (root, m), key
    if best is None:
        return None, {}
    root, m = best
    return m, {"wrapper": type(root).__name__ if root is not m else None, "_root": root}


def _paths(out: Any, prefix: tuple = (), depth: int = 0) -> list[tuple[tuple, torch.Tensor]]:
    found: list[tuple[tuple, torch.Tensor]] = []
    if depth > 6:
        return found
    if isinstance(out, torch.Tensor):
        found.append((prefix, out))
    elif isinstance(out, dict):
        for k, v in out.items():
            found += _paths(v, prefix + (k,), depth + 1)
    elif isinstance(out, (tuple, list)):
        for i, v in enumerate(out):
            found += _paths(v, prefix + (i,), depth + 1)
    return found


def _get(out: Any, path: tuple) -> Any:
    for k in path:
        out = out[k]
    return out


def loss_from_output(call: ModuleCall, roots: list[torch.Tensor]) -> tuple[Callable | None, str]:
    """A loss function (output, batch) -> scalar that takes from a new output what the script's loss took."""
    outs = [(p, t) for p, t in _paths(call.output) if t.is_floating_point() or t.is_complex()]
    root_ids = {id(r) for r in roots if r is not None}
    for path, t in outs:
        if id(t) in root_ids:
            return (lambda out, batch, _p=path: _get(out, _p)), f"the output {_describe(path)} the script backpropagated from"
    nodes, _, _ = graph_leaves(roots)
    used = [(p, t) for p, t in outs if t.grad_fn is not None and id(t.grad_fn) in nodes]
    for path, t in used:  # a scalar output (the model's own loss) that every other used output feeds
        if t.numel() == 1 and t.grad_fn is not None:
            mine, _, _ = graph_leaves([t])
            if all(o is t or id(o.grad_fn) in mine for _, o in used):
                how = f"the output {_describe(path)} the script's loss was computed from"
                return (lambda out, batch, _p=path: _get(out, _p)), how
    if used:
        paths = [p for p, _ in used]

        def projection(out: Any, batch: Any, _paths: list = paths) -> torch.Tensor | None:
            gen = torch.Generator().manual_seed(_PROJECTION_SEED)
            total = None
            for p in _paths:
                o = _get(out, p)
                r = torch.randn(o.shape, generator=gen, dtype=torch.float32).to(device=o.device, dtype=o.dtype)
                term = (o * r).sum()
                total = term if total is None else total + term
            return total

        return projection, "a fixed random projection of the outputs the script's loss was computed from (" + \
            ", ".join(_describe(p) for p in paths[:6]) + ")"
    return None, "a fixed random projection of every floating output (the script's loss was not traced to them)"


def _describe(path: tuple) -> str:
    return "output" + "".join(f"[{k!r}]" for k in path) if path else "output itself"


def _detached(batch: Any, notes: list[str]) -> Any:
    """Tensors the script computed with grad outside the model: their graph is spent, so detach them."""
    if isinstance(batch, torch.Tensor):
        if batch.requires_grad and batch.grad_fn is not None:
            notes.append(f"an input of shape {list(batch.shape)} computed with grad outside the model")
            return batch.detach()
        return batch
    if isinstance(batch, dict):
        return {k: _detached(v, notes) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_detached(v, notes) for v in batch)
    if isinstance(batch, list):
        return [_detached(v, notes) for v in batch]
    return batch


def _scalar_loss(value: Any) -> torch.Tensor | None:
    """The loss a user step function returned: a scalar tensor, or one inside a dict/tuple."""
    for _, t in _paths(value):
        if t.numel() == 1 and t.requires_grad and t.is_floating_point():
            return t
    return None


def replay_one(watch: StepWatch, user: UserCode, outer: list[nn.Module] | None = None) -> Replay | None:
    """Choose the one model and build the replayed step; None when nothing was trained (scriptmode/replay.py first
    asks whether several models were trained). `outer`: outermost_modules(), when the caller walked them already."""
    cap = watch.capture
    roots = [b.root for b in watch.backwards if b.root is not None]
    in_opt: set[int] = set()
    if cap is not None and cap.optimizer is not None:
        in_opt = {id(p) for g in cap.optimizer.param_groups for p in g["params"]}
    _, leaf_ids, _ = graph_leaves(roots)
    model, facts = choose_model(watch, in_opt, leaf_ids, user, outer)
    if model is None:
        return None
    root = facts.pop("_root")
    wrapper = root if root is not model else None
    call = _call_of(watch, model)
    notes: list[str] = []
    if call is not None and callable(call.redirected):
        # the call ran a forward set on the instance for it (Lightning's DDP strategy runs training_step that way):
        # replayed by calling that forward again, with the arguments the call got
        facts.update(replay="the forward the wrapper ran for the call (the model's training step), with its arguments",
                     call_location=call.location)
        return Replay(model, None, None, _method_step(call.redirected, _detached(tuple(call.args), notes),
                                                      _detached(dict(call.kwargs), notes)), facts, wrapper)
    if call is not None:
        loss_fn, how = loss_from_output(call, roots)
        batch = (_detached(tuple(call.args), notes), _detached(dict(call.kwargs), notes))
        facts.update(replay="the model's own call, with the arguments the script passed", loss=how,
                     call_location=call.location)
        if notes:
            facts["detached_inputs"] = notes
        return Replay(model, batch, loss_fn, None, facts, wrapper)
    method = _method_of(watch, model)
    if method is None:
        return Replay(model, None, None, None, dict(facts, replay=None), wrapper)
    fn = method.method
    train_step = _method_step(fn, _detached(method.method_args, notes), _detached(method.method_kwargs, notes))
    facts.update(replay=f"the user's method {getattr(fn, '__qualname__', '?')}, with the arguments it got",
                 call_location=method.location)
    return Replay(model, None, None, train_step, facts, wrapper)


def _method_step(fn: Callable[..., Any], args: Any, kwargs: Any) -> Callable[..., Any]:
    """A train_step that calls the user's method (or the forward a wrapper ran) again and backpropagates its loss."""

    def train_step(m: nn.Module, batch: Any, optimizer: Any) -> Any:
        if optimizer is not None and hasattr(optimizer, "zero_grad"):
            optimizer.zero_grad()
        out = fn(*args, **kwargs)
        loss = _scalar_loss(out)
        if loss is None:
            raise ValueError(f"{getattr(fn, '__qualname__', fn)} returned no scalar loss")
        loss.backward()
        if optimizer is not None and hasattr(optimizer, "step"):
            optimizer.step()
        return out

    return train_step


def _call_of(watch: StepWatch, model: nn.Module) -> ModuleCall | None:
    """The model's last recorded top-level call (or a wrapper's whose child it is)."""
    hit = watch.calls.get(id(model))
    for c in watch.calls.values():
        wraps = any(ch is model for ch in c.module.children()) or unwrap_library(c.module)[0] is model  # compiled(DDP(m))
        if wraps and (hit is None or c.seq > hit.seq):
            if not c.module._parameters or not [p for p in c.module._parameters.values() if p is not None]:
                hit = c
    return hit


def _method_of(watch: StepWatch, model: nn.Module) -> ModuleCall | None:
    """The last recorded call made from a method of `model` (e.g. its training_step)."""
    best = None
    for c in watch.calls.values():
        owner = getattr(c.method, "__self__", None)
        if owner is model and (best is None or c.seq > best.seq):
            best = c
    return best


def backward_locations(backwards: list[Backward]) -> list[dict]:
    seen, out = set(), []
    for b in backwards:
        loc = b.location
        key = (loc or {}).get("file"), (loc or {}).get("line")
        if loc is not None and key not in seen:
            seen.add(key)
            out.append(dict(loc, file=os.path.basename(loc["file"])))
    return out[:5]


__all__ = ["Replay", "replay_one", "graph_leaves", "floating_outputs", "backward_locations"]
