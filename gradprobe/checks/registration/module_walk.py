"""What the registration rules read: one walk over every module's `__dict__`, measured as facts.

The walk sees what `named_parameters()` cannot: plain tensors that require grad, parameters and modules in Python
containers, `module.requires_grad = ...` attributes, buffers, grad-mode decorators on forward, frozen and tied
parameters. The rules are in engine.py (and unregistered.py for plain tensors and buffers), beside this module.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.core.torchcompat import is_grad_mode_decorator_frame
from gradprobe.findings import Finding
from gradprobe.userframes import UserCode, location

if TYPE_CHECKING:  # loading imports the checks package: no import cycle at run time
    from gradprobe.loading import BuildRecord

Loc = dict[str, Any]
MODULE_INTERNALS = set(vars(nn.Module()).keys())


def rhs_of(loc: Loc | None, attr: str) -> str | None:
    """The right-hand side of the user's `self.<attr> = <rhs>` line, to write the fix in their own words."""
    m = re.match(rf"^\s*[\w.]*\b{re.escape(attr)}\s*=\s*(.+?)\s*(#.*)?$", (loc or {}).get("code", ""))
    return m.group(1) if m else None


def container_items(value: Any, depth: int = 0) -> list[tuple[str, Any]] | None:
    """(dotted key, item) of a list/tuple/dict attribute, one level of nesting included ([[p, q], [r]])."""
    if isinstance(value, (list, tuple)):
        pairs = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        return None
    if depth == 0:
        flat: list[tuple[str, Any]] = []
        for k, v in pairs:
            inner = container_items(v, 1) if isinstance(v, (list, tuple, dict)) else None
            flat += [(f"{k}.{k2}", v2) for k2, v2 in inner] if inner is not None else [(k, v)]
        return flat
    return pairs


def grad_mode_decorator(fn: Any) -> str | None:
    """If fn is wrapped by torch's no_grad/inference_mode decorator, the context's name."""
    code = getattr(fn, "__code__", None)
    if not is_grad_mode_decorator_frame(code):
        return None
    for cell in fn.__closure__ or ():
        try:
            val = cell.cell_contents
        except ValueError:
            continue
        ctx = getattr(val, "__self__", val)
        if isinstance(ctx, (torch.no_grad, torch.inference_mode)):
            return type(ctx).__name__
        if isinstance(ctx, torch.set_grad_enabled) and not getattr(ctx, "mode", True):
            return "set_grad_enabled(False)"
    return None


def freeze_site(build_record: BuildRecord | None, tensors: list[torch.Tensor]) -> Loc | None:
    """The user line that froze most of `tensors` (requires_grad_(False) / requires_grad = False), if recorded."""
    table = getattr(build_record, "frozen_sites", None) or {}
    hits = [table[id(t)][1] for t in tensors if id(t) in table]
    if not hits:
        return None
    counts = Counter((h["file"], h["line"]) for h in hits)
    top = counts.most_common(1)[0][0]
    return next(h for h in hits if (h["file"], h["line"]) == top)


@dataclass
class AttrFacts:
    """One attribute of one module that a registration rule may be about."""

    owner: nn.Module
    mod_name: str  # the owner's name in the model ("" for the root)
    prefix: str  # "<mod_name>." or ""
    attr: str
    value: Any
    site: Loc | None  # the user's line that set it, if recorded
    container: str | None = None  # "list", "tuple" or "dict" for a Python container
    stray_params: list[str] = field(default_factory=list)  # unregistered Parameters in the container
    stray_modules: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (path, class, unregistered params)
    stray_tensors: list[str] = field(default_factory=list)  # plain tensors with requires_grad in the container

    @property
    def path(self) -> str:
        return self.prefix + self.attr

    @property
    def rhs(self) -> str | None:
        return rhs_of(self.site, self.attr)

    @property
    def owner_class(self) -> str:
        return type(self.owner).__name__


@dataclass
class BufferFacts:
    path: str
    name: str
    buf: torch.Tensor
    site: Loc | None


@dataclass
class DecoratedForward:
    """A module whose forward is wrapped in no_grad/inference_mode, with the trainable parameters it holds."""

    kind: str
    names: list[str]
    location: Loc | None
    library: bool  # the decorated forward is library code (by design), not the user's


@dataclass
class ModuleFacts:
    owner: nn.Module
    mod_name: str
    attributes: list[AttrFacts]
    buffers: list[BufferFacts]
    decorated: DecoratedForward | None


@dataclass
class ModelFacts:
    modules: list[ModuleFacts]
    params: list[tuple[str, nn.Parameter]]
    frozen: list[str]
    freeze_at: Loc | None
    aliases: list[list[str]]  # names of one Parameter, when it has several
    alias_trains: list[bool]  # whether each aliased Parameter requires grad
    grad_off: bool  # gradient recording is globally off after the build
    grad_off_sites: list[tuple[int, Loc]]
    unregistered: bool  # a plain tensor, container or non-leaf attribute holds what should be a parameter
    by_module: str = ""  # the trainable set by module tree, one line (checks/trainable_set.py)


def _measure_container(facts: AttrFacts, items: list[tuple[str, Any]], registered: set[int]) -> None:
    for key, v in items:
        if isinstance(v, nn.Parameter):
            if id(v) not in registered:
                facts.stray_params.append(f"{facts.path}.{key}")
        elif isinstance(v, nn.Module):
            inner = [(f"{facts.path}.{key}.{n}", p) for n, p in v.named_parameters()]
            if any(id(p) not in registered for _, p in inner):
                facts.stray_modules.append((f"{facts.path}.{key}", type(v).__name__,
                                            [n for n, p in inner if id(p) not in registered]))
        elif isinstance(v, torch.Tensor) and v.requires_grad:
            facts.stray_tensors.append(f"{facts.path}.{key}")


def _attribute(module: nn.Module, mod_name: str, attr: str, value: Any, site: Loc | None,
               registered: set[int]) -> AttrFacts | None:
    """The facts of one attribute, or None when no rule reads it."""
    facts = AttrFacts(module, mod_name, f"{mod_name}." if mod_name else "", attr, value, site)
    if isinstance(value, torch.Tensor):
        return facts if value.requires_grad else None
    items = container_items(value)
    if items is not None:
        facts.container = type(value).__name__
        _measure_container(facts, items, registered)
        return facts
    return facts if attr == "requires_grad" and isinstance(value, bool) else None


def _decorated(module: nn.Module, prefix: str, user: UserCode | None) -> DecoratedForward | None:
    kind = grad_mode_decorator(type(module).forward)
    names = [prefix + n for n, p in module.named_parameters() if p.requires_grad] if kind else []
    if not kind or not names:  # a parameterless no_grad module (sinusoidal positions) takes no gradient from anyone
        return None
    fwd = type(module).forward
    code = getattr(getattr(fwd, "__wrapped__", fwd), "__code__", None)
    loc = location(code.co_filename, code.co_firstlineno, code.co_name) if code is not None else None
    library = code is not None and user is not None and not user.is_user_file(code.co_filename)
    return DecoratedForward(kind, names, loc, library)


def _module_facts(mod_name: str, module: nn.Module, build_record: BuildRecord | None, registered: set[int],
                  user: UserCode | None) -> ModuleFacts:
    def site(name: str) -> Loc | None:
        return build_record.site_of(module, name) if build_record is not None else None

    prefix = f"{mod_name}." if mod_name else ""
    attrs = [a for a in (_attribute(module, mod_name, attr, value, site(attr), registered)
                         for attr, value in vars(module).items() if attr not in MODULE_INTERNALS) if a is not None]
    buffers = [BufferFacts(prefix + n, n, b, site(n)) for n, b in module._buffers.items() if b is not None]
    return ModuleFacts(module, mod_name, attrs, buffers, _decorated(module, prefix, user))


def _holds_unregistered(modules: list[ModuleFacts]) -> bool:
    return any(isinstance(a.value, torch.Tensor) or a.stray_params or a.stray_modules or a.stray_tensors
               for m in modules for a in m.attributes)


def measure_model(model: nn.Module, build_record: BuildRecord | None = None, info: dict[str, Any] | None = None,
                  user: UserCode | None = None) -> ModelFacts:
    registered = {id(p) for p in model.parameters()}
    modules = [_module_facts(n, m, build_record, registered, user) for n, m in model.named_modules()]
    params = list(model.named_parameters())
    frozen = [n for n, p in params if not p.requires_grad]
    by_id: dict[int, list[str]] = {}
    trains: dict[int, bool] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
        trains.setdefault(id(p), p.requires_grad)
    tied = [pid for pid, names in by_id.items() if len(names) > 1]
    return ModelFacts(
        modules=modules, params=params, frozen=frozen,
        freeze_at=freeze_site(build_record, [p for _, p in params if not p.requires_grad]),
        aliases=[by_id[pid] for pid in tied], alias_trains=[trains[pid] for pid in tied],
        grad_off=(info or {}).get("grad_enabled_after_build") is False,
        grad_off_sites=list(getattr(build_record, "grad_off_sites", None) or []),
        unregistered=_holds_unregistered(modules))


def one_per_line(findings: list[Finding], per_attribute: set[str]) -> list[Finding]:
    """One finding per cause: a class whose __init__ line registers wrongly is instantiated many times
    (every block's norm), and each instance would repeat the same finding; merge them, naming every instance."""
    out: list[Finding] = []
    by_line: dict[tuple[Any, ...], Finding] = {}
    for f in findings:
        loc = dict(f.get("location") or {})
        key = (f["code"], f["severity"], loc.get("file"), loc.get("line"))
        if f["code"] not in per_attribute or loc.get("line") is None:
            out.append(f)
            continue
        first = by_line.get(key)
        if first is None:
            by_line[key] = f
            out.append(f)
            continue
        first["parameters"] = list(first["parameters"]) + [p for p in f["parameters"] if p not in first["parameters"]]
        first["evidence"].setdefault("instances", 1)
        first["evidence"]["instances"] += 1
    for f in by_line.values():
        n = f["evidence"].get("instances")
        if n:
            more = "..." if len(f["parameters"]) > 6 else ""
            f["message"] += f" The same line made {n} such attributes: {', '.join(f['parameters'][:6])}{more}."
    return out
