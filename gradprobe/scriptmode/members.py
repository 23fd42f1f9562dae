"""Which models a script trains, found at its step by tensor identity, never by names.

A script may train several models that no module of its own holds together (a UNet and a text encoder under one
optimizer with two parameter groups, a generator and a discriminator under two optimizers, a student beside a frozen
teacher). At the step, among the live outermost modules (library wrappers unwrapped):

- a **trained** model holds parameters that a live optimizer holds (the one stepping, one the script holds, one that
  has stepped) or that are leaves of the backpropagated loss's graph; it counts when the script holds it (a variable,
  an item or attribute of one, in its frames at the step), or its forward ran since the last optimizer step;
- a **frozen** model beside them holds parameters, none of them in an optimizer or the loss's graph, and its forward
  ran since the last optimizer step (a teacher or a VAE under no_grad, a frozen text encoder): it is said, never
  reported as missing from an optimizer.

A module that nothing but gradprobe holds (an old module the script replaced after building the optimizer) is none of
them, so the optimizer's tensors that only it holds are stale (GP202). Each model is named after the script's own
variable (or key, or attribute) that holds it, found by identity in the user's frames, the outermost frame first (the
one that holds it longest); else after its class. With one trained model the model is that module, as it always was;
with several, a ModelSet (modelset.py) holds them under those names.
"""

from __future__ import annotations

import itertools
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from gradprobe.modelset import ModelSet, reserved_names
from gradprobe.userframes import UserCode

_MAX_ITEMS = 64  # items of a container looked at
_MAX_DEPTH = 2  # containers and the script's own objects looked into, below a frame's names


@dataclass
class Member:
    label: str
    root: nn.Module  # the outermost module (a library wrapper, when there is one)
    module: nn.Module  # the model itself (unwrapped)
    trained: bool
    in_step: bool = False  # holds parameters of the stepping optimizer or of the loss's graph
    held_as: str | None = None  # the script's own name for it, when found
    called: bool = False  # its forward (or a submodule's, as a top-level call) ran since the last optimizer step
    no_grad_only: bool = False  # ... and only with grad disabled


@dataclass
class Members:
    trained: list[Member] = field(default_factory=list)
    frozen: list[Member] = field(default_factory=list)

    @property
    def several(self) -> bool:
        return len(self.trained) > 1

    def step(self) -> list[Member]:
        return [m for m in self.trained if m.in_step]

    def facts(self) -> list[dict[str, Any]]:
        """What the report says of each model."""
        rows = []
        for m in self.trained + self.frozen:
            params = list(m.module.parameters())
            rows.append({"name": m.label, "class": type(m.module).__name__, "role": "trained" if m.trained else "frozen",
                         "tensors": len(params), "trainable": sum(p.requires_grad for p in params),
                         "held_as": m.held_as, "called": m.called, "no_grad_only": m.no_grad_only,
                         "in_this_step": m.in_step})
        return rows


def user_names(user: UserCode, frame: types.FrameType | None = None) -> dict[int, str]:
    """id(object) -> the name the user's code holds it by: a module or an optimizer in a user frame's locals or
    globals, or inside a container or an object of the user's own class held there (its key or attribute). The
    outermost user frame first, and a frame's own names before what its containers hold."""
    frames = []
    f: types.FrameType | None = frame or sys._getframe(1)
    while f is not None:
        if user.is_user_file(f.f_code.co_filename):
            frames.append(f)
        f = f.f_back
    out: dict[int, str] = {}
    try:
        _walk(frames, user, out)
    except Exception:  # a container changed under us (another thread), an odd object: what was found stands
        pass
    return out


def _walk(frames: list[types.FrameType], user: UserCode, out: dict[int, str]) -> None:
    seen: set[int] = set()
    level: list[tuple[str, Any]] = []
    for f in reversed(frames):
        scopes = (f.f_globals,) if f.f_code.co_name == "<module>" else (f.f_locals, f.f_globals)
        for scope in scopes:
            level += [(k, v) for k, v in list(scope.items()) if not k.startswith("_") and k != "self"]
            if "self" in scope and not issubclass(type(scope["self"]), nn.Module):
                level.append(("self", scope["self"]))
    for _depth in range(_MAX_DEPTH + 1):
        nxt: list[tuple[str, Any]] = []
        for name, v in level:
            if id(v) in seen:
                continue
            seen.add(id(v))
            # type(), not isinstance(): a dead weakref.proxy raises on any attribute access, __class__ included
            if issubclass(type(v), (nn.Module, torch.optim.Optimizer)):
                if name != "self":
                    out.setdefault(id(v), name)
                continue
            nxt += _inside(name, v, user)
        level = nxt


def _inside(name: str, v: Any, user: UserCode) -> list[tuple[str, Any]]:
    """The named items of a container, or the attributes of an object of the user's own class (or a namespace)."""
    kind = type(v)
    if issubclass(kind, dict):
        return [(k if isinstance(k, str) and k.isidentifier() else f"{name}_{k}", x)
                for k, x in itertools.islice(v.items(), _MAX_ITEMS)]
    if issubclass(kind, (list, tuple)):
        return [(f"{name}_{i}", x) for i, x in enumerate(itertools.islice(v, _MAX_ITEMS))]
    if issubclass(kind, (type, types.ModuleType, types.FunctionType, types.MethodType, torch.Tensor)):
        return []
    if issubclass(kind, types.SimpleNamespace) or _users_class(v, user):
        attrs = getattr(v, "__dict__", None)
        if isinstance(attrs, dict):
            return [(k, x) for k, x in itertools.islice(attrs.items(), _MAX_ITEMS) if not k.startswith("__")]
    return []


def _users_class(v: Any, user: UserCode) -> bool:
    mod = sys.modules.get(type(v).__module__)
    path = getattr(mod, "__file__", None)
    return isinstance(path, str) and user.is_user_file(path)


def window_start(watch: Any) -> int:
    """The seq of the last completed optimizer step: what came after it is this step's."""
    return watch.step_seqs[-1] if watch.step_seqs else 0


def _window_calls(watch: Any) -> tuple[set[int], set[int]]:
    """ids of the modules whose top-level forward ran since the last optimizer step: with grad, without."""
    start = window_start(watch)
    grad = {mid for mid, c in watch.calls.items() if c.seq > start}
    quiet = {mid for mid, seq in watch.quiet_calls.items() if seq > start}
    return grad, quiet


def _live_optimizer_params(watch: Any, captured: Any, names: dict[int, str]) -> set[int]:
    """Parameters of the optimizers that belong to the training: the one stepping, one that has stepped, one the
    script holds (a GAN's second optimizer, not stepped yet at the first step)."""
    out: set[int] = set()
    for opt in watch.optimizers:
        if opt is captured or id(opt) in watch.stepped or id(opt) in names:
            out |= {id(p) for g in opt.param_groups for p in g["params"]}
    return out


def find_members(watch: Any, captured: Any, in_graph: set[int], user: UserCode, step_graph: set[int] | None = None,
                 frame: types.FrameType | None = None, outer: list[nn.Module] | None = None) -> Members:
    """The trained and frozen models at the step (see the module docstring). `captured`: the optimizer stepping (or
    None); `in_graph`: ids of the leaves of the graphs the script's backward() calls ran on; `step_graph`: of those
    since the last optimizer step (this step's loss; default `in_graph`); `outer`: step.outermost_modules(), when the
    caller has walked the live objects already."""
    step_graph = in_graph if step_graph is None else step_graph
    from gradprobe.scriptmode.step import outermost_modules, unwrap
    from gradprobe.sharded import unsharded_to_sharded

    # no gc.collect(): a module the script let go of may still be alive (gradprobe's own records keep what they saw
    # built), so it is a model only when the script holds it or its forward ran in this step
    names = user_names(user, frame or sys._getframe(1))
    watch.labels.update({k: v for k, v in names.items() if k not in watch.labels})
    in_step_opt = {id(p) for g in captured.param_groups for p in g["params"]} if captured is not None else set()
    in_opts = _live_optimizer_params(watch, captured, names) | in_step_opt
    grad_calls, quiet_calls = _window_calls(watch)
    found = Members()
    seen: set[int] = set()
    for root in outermost_modules() if outer is None else outer:
        m = unwrap(root, user)
        if id(m) in seen:
            continue
        seen.add(id(m))
        ids = {id(p) for p in m.parameters()} | set(unsharded_to_sharded(m))
        if not ids:
            continue
        subs = {id(x) for x in root.modules()}
        called, quiet = bool(subs & grad_calls), bool(subs & quiet_calls)
        # the name the script holds it by now; one found at an earlier step when the script's frames are gone
        held_as = names.get(id(root)) or names.get(id(m)) or watch.labels.get(id(root)) or watch.labels.get(id(m))
        trained = bool(ids & (in_opts | in_graph))
        member = Member(label="", root=root, module=m, trained=trained, in_step=bool(ids & (in_step_opt | step_graph)),
                        held_as=held_as, called=called or quiet, no_grad_only=quiet and not called)
        if trained and (held_as is not None or called):
            found.trained.append(member)
        elif not trained and (called or quiet):
            found.frozen.append(member)
    _name(found)
    return found


def _name(found: Members) -> None:
    """Unique child names: the script's own name, else the class name (`_2`, `_3` for a second and third)."""
    taken = reserved_names()
    used: set[str] = set()
    for member in found.trained + found.frozen:
        base = member.held_as if member.held_as and member.held_as.isidentifier() else type(member.module).__name__
        label, n = base, 1
        while label in used or label in taken:
            n += 1
            label = f"{base}_{n}"
        used.add(label)
        member.label = label


def model_of(members: list[Member]) -> ModelSet:
    return ModelSet({m.label: m.module for m in members})
