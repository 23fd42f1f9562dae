"""GP212/GP213 in a script's own loop: which of its optimizers clears and steps which parameters.

At the main optimizer's first step, the optimizers alive then that hold trainable parameters, none shared with
another (a wrapper and the optimizer it wraps hold the same ones: one network, nothing to compare), are watched
with checks/steps/optimizer_owners.OwnersWatch. Parameters of the chosen model keep the model's names; those of
another network are named after the user's own variable that holds it (`netG.0.weight`), found by identity in the
user's frames at that step, else after its class.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch.nn as nn

from gradprobe.checks.core.step import param_names
from gradprobe.checks.steps.optimizer_owners import OwnersWatch
from gradprobe.userframes import UserCode


def _labels(modules: dict[int, nn.Module], user: UserCode) -> dict[int, str]:
    """id(module) -> the name of a variable of the user's code that holds it (innermost user frame first)."""
    out: dict[int, str] = {}
    f: FrameType | None = sys._getframe(1)
    while f is not None and len(out) < len(modules):
        if user.is_user_file(f.f_code.co_filename):
            for scope in (f.f_locals, f.f_globals):
                for k, v in list(scope.items()):
                    if id(v) in modules and id(v) not in out and not k.startswith("_"):
                        out[id(v)] = k
        f = f.f_back
    return out


def _owned(optimizers: list[Any]) -> list[Any]:
    """The optimizers to compare: alive, holding trainable parameters, none shared with another."""
    live = [o for o in optimizers if any(getattr(p, "requires_grad", False) for g in o.param_groups for p in g["params"])]
    seen: set[int] = set()
    for o in live:
        ids = {id(p) for g in o.param_groups for p in g["params"]}
        if ids & seen:
            return []
        seen |= ids
    return live


def start_owners(model: nn.Module | None, names: dict[int, str], optimizers: list[Any], record: Any,
                 user: UserCode) -> OwnersWatch | None:
    """The watch of several optimizers, entered; None when fewer than two optimizers are to be compared."""
    from gradprobe.scriptmode.step import outermost_modules, unwrap

    live = _owned(optimizers)
    if len(live) < 2:
        return None
    in_model = {id(p) for p in model.parameters()} if model is not None else set()
    wanted = {id(p) for o in live for g in o.param_groups for p in g["params"]} - in_model
    all_names = {pid: n for pid, n in names.items() if pid in in_model}
    if wanted:
        holders = [m for m in outermost_modules() if {id(p) for p in m.parameters()} & wanted]
        labels = _labels({id(m): m for m in holders}, user)
        for m in holders:
            inner = unwrap(m, user)
            label = labels.get(id(m)) or labels.get(id(inner)) or type(inner).__name__
            for pid, ns in param_names(inner).items():
                if pid in wanted:
                    all_names.setdefault(pid, f"{label}.{ns[0]}")
    sites = {id(o): (record.optimizer_sites.get(id(o)) or (0, None))[1] if record is not None else None for o in live}
    watch = OwnersWatch.for_script(live, all_names, sites, user)
    return watch.__enter__()
