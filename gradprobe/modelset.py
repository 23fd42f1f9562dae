"""Several models trained together, checked as one: `ModelSet`.

A script that trains a UNet and a text encoder, a generator and a discriminator, or a student beside a teacher holds
several modules that no module of its own holds together. Every check works on one nn.Module: a ModelSet is that
module. It holds each model as a child under the name the user's code holds it by (the script's variable
`text_encoder`, a key of the dict build_model() returned), so that every parameter name says which model it belongs to
(`text_encoder.…`, `unet.…`). The models themselves are not changed: a module may be the child of several modules,
and a ModelSet adds no parameter, buffer or hook of its own.

Its forward replays one step across the models (the plan is built in script mode by scriptmode/members.py from the
calls the script made): each call with the arguments the script passed, where an argument that was (by identity) an
earlier call's output is replaced by that call's new output, so the gradient flows from one model into the next as it
did in the script. The build_model() form (which returns a tuple, list or dict of modules) runs the user's own
train_step instead, on the models as it returned them (`as_given`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn


@dataclass(frozen=True)
class FromCall:
    """An argument of a replayed call that was, in the script, the output of an earlier call (at `path` inside it)."""

    index: int
    path: tuple


@dataclass
class PlannedCall:
    """One call of the replayed step: the module (its path inside the ModelSet), the arguments as the script passed
    them (tensors computed with grad outside the models detached), the member it belongs to."""

    module_path: str
    args: tuple
    kwargs: dict
    member: str
    location: dict | None = None


@dataclass
class _Plan:
    """Held outside the module's attributes (a plain object, so no check reads its tensors as the model's)."""

    calls: list[PlannedCall] = field(default_factory=list)
    sinks: list[int] = field(default_factory=list)  # calls whose output the step's loss was computed from


class ModelSet(nn.Module):
    """Several models checked as one (see the module docstring). `given`: how build_model() returned them ("tuple",
    "list", "dict"), None in script mode; `keys`: a dict's own keys by child name."""

    def __init__(self, members: dict[str, nn.Module], given: str | None = None, keys: dict[str, Any] | None = None) -> None:
        super().__init__()
        for label, module in members.items():
            self.add_module(label, module)
        self._given = given
        self._keys = dict(keys or {})  # child name -> the user's own dict key
        self._plan = _Plan()

    @property
    def given(self) -> str | None:
        return self._given

    @property
    def labels(self) -> list[str]:
        return list(self._modules)

    def member_items(self) -> Iterator[tuple[str, nn.Module]]:
        for label, module in self._modules.items():
            if module is not None:
                yield label, module

    def as_given(self) -> Any:
        """The models in the shape build_model() returned them (its tuple, list or dict), as the user's functions take
        them; in script mode, a dict by name."""
        mods = dict(self.member_items())
        if self._given == "tuple":
            return tuple(mods.values())
        if self._given == "list":
            return list(mods.values())
        if self._given == "dict":
            return {self._keys.get(k, k): v for k, v in mods.items()}
        return mods

    def set_plan(self, calls: list[PlannedCall], sinks: list[int]) -> None:
        self._plan = _Plan(calls, sinks)

    @property
    def plan(self) -> list[PlannedCall]:
        return self._plan.calls

    @property
    def sinks(self) -> list[int]:
        return self._plan.sinks

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        plan = self._plan
        if not plan.calls:
            raise TypeError(f"the models {', '.join(self.labels)} were given together (build_model() returned several "
                            "modules): a train_step(models, batch, optimizer) says how one step uses them")
        outs: list[Any] = []
        for call in plan.calls:
            module = self.get_submodule(call.module_path)
            outs.append(module(*_fill(call.args, outs), **_fill(call.kwargs, outs)))
        if len(plan.sinks) == 1:
            return outs[plan.sinks[0]]
        return {sink_key(plan.calls[i], i): outs[i] for i in plan.sinks}


def sink_key(call: PlannedCall, index: int) -> str:
    """The key of a sink's output in the forward's dict: the member's name, and the call's index."""
    return f"{call.member}#{index}"


def _get(out: Any, path: tuple) -> Any:
    for k in path:
        out = out[k]
    return out


def _fill(value: Any, outs: list[Any]) -> Any:
    if isinstance(value, FromCall):
        return _get(outs[value.index], value.path)
    if isinstance(value, tuple):
        return tuple(_fill(v, outs) for v in value)
    if isinstance(value, list):
        return [_fill(v, outs) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, outs) for k, v in value.items()}
    return value


def several_modules(obj: Any) -> tuple[dict[str, nn.Module], str] | None:
    """(models by name, the shape given) when `obj` is a tuple, list or dict of at least two nn.Modules (what
    build_model() may return), else None. A dict's keys name the models; a tuple's or list's models are named after
    their class (`Generator`, `Discriminator`; `Linear_1`, `Linear_2` for two of one class)."""
    if isinstance(obj, dict) and len(obj) >= 2 and all(isinstance(v, nn.Module) for v in obj.values()):
        return {_attr(str(k), i): v for i, (k, v) in enumerate(obj.items())}, "dict"
    if isinstance(obj, (tuple, list)) and len(obj) >= 2 and all(isinstance(v, nn.Module) for v in obj):
        classes = [type(m).__name__ for m in obj]
        names = [_attr(c if classes.count(c) == 1 else f"{c}_{classes[:i + 1].count(c)}", i) for i, c in enumerate(classes)]
        return dict(zip(names, obj, strict=True)), "tuple" if isinstance(obj, tuple) else "list"
    return None


def _attr(key: str, index: int) -> str:
    """A child name from a dict key: a module's child name has no '.', is not empty, and is no attribute of a ModelSet
    (`train`, `forward`)."""
    name = key.replace(".", "_")
    name = name if name and name.isidentifier() else f"model_{index}"
    return name + "_" if name in reserved_names() else name


def reserved_names() -> set[str]:
    """Names a child of a ModelSet cannot take: its own attributes and methods."""
    return set(dir(ModelSet({})))


def from_given(obj: Any) -> ModelSet | None:
    """A ModelSet over what build_model() returned, when it is several modules; None otherwise."""
    found = several_modules(obj)
    if found is None:
        return None
    members, given = found
    keys = {_attr(str(k), i): k for i, k in enumerate(obj)} if given == "dict" else None  # for as_given()
    return ModelSet(members, given, keys)


def for_user(fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """The user's train_step or make_optimizer, called with the models as build_model() returned them when gradprobe
    hands it a ModelSet (a copy of it too: autocast_underflow reruns the step on one)."""
    if fn is None:
        return None

    def call(model: Any, *args: Any) -> Any:
        return fn(model.as_given() if isinstance(model, ModelSet) else model, *args)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    call.__name__ = getattr(fn, "__name__", "call")
    call.__qualname__ = getattr(fn, "__qualname__", call.__name__)
    return call


def idle_members(models: nn.Module, outside: set[str], got_grad: set[int]) -> set[str]:
    """The models beside the trained ones, frozen by design (a teacher used under no_grad as the target): every one of
    their trainable parameters is in `outside` (no optimizer holds it) and none got a gradient in the step."""
    if not isinstance(models, ModelSet):
        return set()
    out = set()
    for label, member in models.member_items():
        trainable = [(n, p) for n, p in member.named_parameters() if p.requires_grad]
        if trainable and all(f"{label}.{n}" in outside and id(p) not in got_grad for n, p in trainable):
            out.add(label)
    return out
