"""The trainable set by module tree: per stack of repeated blocks, how many are trainable; per region besides them,
what is trainable, so that a lock or an unfreeze count that is off by one is visible at a glance.

A *stack* is a module's children of one class that repeat (two or more composite children of the same class: a
ModuleList or Sequential of transformer blocks, residual stages), found by the tree's structure, never by names. The
outermost stacks are reported as "k of n <Class> trainable" with the indices of the trainable (and partly trainable)
ones. The parameters outside every stack are grouped by *region*: the children of the first module (from the root)
that has two or more children with parameters (a PEFT or DDP wrapper's single child is passed through), and the
parameters held directly by the modules above it. A frozen module whose values were written only by its initialiser
during the build (initwrites.py) is marked "at its initialisation".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn
from gradprobe.checks.core.rule_text import and_more

MAX_LINES = 12  # lines of the tree printed in a summary; the facts hold every stack and region
MAX_NAMES = 4


@dataclass
class Stack:
    path: str
    cls: str
    members: list[str]  # child names, in order
    trainable: list[int] = field(default_factory=list)  # indices of the members whose every parameter trains
    partly: list[int] = field(default_factory=list)  # indices of the members with some parameters trainable


@dataclass
class Region:
    path: str
    tensors: int = 0
    trainable: int = 0
    trainable_modules: list[str] = field(default_factory=list)
    frozen_modules: list[str] = field(default_factory=list)
    at_init: list[str] = field(default_factory=list)  # frozen modules whose values only an initialiser wrote


def _own(module: nn.Module) -> list[nn.Parameter]:
    return list(module.parameters(recurse=False))


def _has_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _stacks(model: nn.Module) -> list[Stack]:
    """The outermost stacks of repeated composite children of one class."""
    found: list[Stack] = []
    inside: list[str] = []  # member prefixes of the stacks found so far
    for path, module in model.named_modules():
        if any(path == p or path.startswith(p + ".") for p in inside):
            continue
        groups: dict[type, list[str]] = {}
        for name, child in module.named_children():
            if _has_params(child) and next(child.children(), None) is not None:
                groups.setdefault(type(child), []).append(name)
        for cls, names in groups.items():
            if len(names) < 2:
                continue
            stack = Stack(path, cls.__name__, names)
            for i, name in enumerate(names):
                flags = [p.requires_grad for p in module.get_submodule(name).parameters()]
                if all(flags):
                    stack.trainable.append(i)
                elif any(flags):
                    stack.partly.append(i)
                inside.append(f"{path}.{name}" if path else name)
            found.append(stack)
    return found


def _split_point(model: nn.Module) -> tuple[str, nn.Module]:
    """The first module from the root with two or more children that hold parameters (or with parameters of its own)."""
    path, module = "", model
    while True:
        kids = [(n, c) for n, c in module.named_children() if _has_params(c)]
        if len(kids) != 1 or _own(module):
            return path, module
        name, module = kids[0]
        path = f"{path}.{name}" if path else name


def _regions(model: nn.Module, stacks: list[Stack], at_init: set[int]) -> list[Region]:
    inside = [f"{s.path}.{m}" if s.path else m for s in stacks for m in s.members]
    top, split = _split_point(model)
    prefix = f"{top}." if top else ""
    regions: dict[str, Region] = {}
    for mpath, module in model.named_modules():
        own = _own(module)
        if not own or any(mpath == p or mpath.startswith(p + ".") for p in inside):
            continue
        rest = mpath[len(prefix):] if mpath.startswith(prefix) else ""
        key = prefix + rest.split(".")[0] if rest else (mpath or "(root)")
        r = regions.setdefault(key, Region(key))
        r.tensors += len(own)
        n_train = sum(p.requires_grad for p in own)
        r.trainable += n_train
        short = mpath[len(key) + 1:] if mpath.startswith(key + ".") else "" if mpath == key else mpath.rsplit(".", 1)[-1]
        if short:
            (r.trainable_modules if n_train else r.frozen_modules).append(short)
        else:  # the region's own parameters, by name
            for n, p in module.named_parameters(recurse=False):
                (r.trainable_modules if p.requires_grad else r.frozen_modules).append(n)
        if not n_train and all(id(p) in at_init for p in own):
            r.at_init.append(short)
    return list(regions.values())


def _indices(ix: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[str] = []
    for i in ix:
        if runs and runs[-1].split("-")[-1].isdigit() and int(runs[-1].split("-")[-1]) == i - 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{i}"
        else:
            runs.append(str(i))
    return ", ".join(runs)


def _names(names: list[str]) -> str:
    return and_more(names, MAX_NAMES)


def stack_line(s: Stack) -> str:
    n, k = len(s.members), len(s.trainable)
    numbered = all(m.isdigit() for m in s.members)  # a ModuleList or Sequential: indices; else the children's names

    def which(ix: list[int]) -> str:
        return _indices([int(s.members[i]) for i in ix]) if numbered else _names([s.members[i] for i in ix])
    label = s.path if numbered else ".".join(filter(None, [s.path, "{" + ", ".join(s.members[:MAX_NAMES]) + "}"]))
    line = f"{label}: {k} of {n} {s.cls} trainable"
    if 0 < k < n:
        line += f" ({which(s.trainable)})"
    if s.partly:
        line += f"; {len(s.partly)} partly ({which(s.partly)})"
    return line


def region_line(r: Region, stacks: list[Stack]) -> str:
    if r.path == "(root)":  # the root's own parameters (a logit scale): named
        names = r.trainable_modules + r.frozen_modules
        r = Region(_names(names), r.tensors, r.trainable, r.trainable_modules, r.frozen_modules, r.at_init)
    besides = " (besides its blocks)" if any(s.path == r.path or s.path.startswith(r.path + ".") for s in stacks) else ""
    if r.trainable == r.tensors:
        state = f"trainable ({r.tensors} tensor{'s' if r.tensors != 1 else ''})"
    elif r.trainable == 0:
        state = f"frozen ({r.tensors} tensor{'s' if r.tensors != 1 else ''})"
    else:
        state = f"{r.trainable} of {r.tensors} tensors trainable ({_names(r.trainable_modules)})"
    whole = [n for n in r.at_init if not n]
    if whole and len(r.at_init) == 1:
        state += ", at its initialisation (no load wrote it)"
    elif r.at_init:
        state += f"; frozen at their initialisation: {_names([n or r.path for n in r.at_init])}"
    return f"{r.path}{besides}: {state}"


def _lines(stacks: list[Stack], regions: list[Region]) -> Iterator[tuple[str, str]]:
    """(path, line) for every stack and region, in the model's order (a region's blocks right after it)."""
    shown: set[int] = set()
    for r in regions:
        yield r.path, region_line(r, stacks)
        for i, s in enumerate(stacks):
            if i not in shown and (s.path == r.path or s.path.startswith(r.path + ".")):
                shown.add(i)
                yield s.path, stack_line(s)
    for i, s in enumerate(stacks):
        if i not in shown:
            yield s.path, stack_line(s)


def trainable_set(model: nn.Module, record: Any = None) -> dict[str, Any]:
    """The facts: stacks, regions, and the lines that print them."""
    from gradprobe.checks.registration.frozen_init import unit_ids

    at_init = unit_ids(model, record)
    stacks = _stacks(model)
    regions = _regions(model, stacks, at_init)
    params = list(model.parameters())
    return {
        "trainable": sum(p.requires_grad for p in params), "tensors": len(params),
        "stacks": [{"path": s.path, "class": s.cls, "count": len(s.members), "trainable": s.trainable,
                    "partly": s.partly} for s in stacks],
        "regions": [{"path": r.path, "tensors": r.tensors, "trainable": r.trainable,
                     "trainable_modules": r.trainable_modules[:40],
                     "frozen_at_init": [n or r.path for n in r.at_init][:40]} for r in regions],
        "lines": [line for _, line in _lines(stacks, regions)],
        "stack_lines": [stack_line(s) for s in stacks],
    }


def summary_lines(tset: dict[str, Any], cap: int = MAX_LINES) -> list[str]:
    """The tree as summary lines, capped; says how many were left out."""
    lines = tset["lines"]
    if tset["trainable"] == tset["tensors"]:  # nothing frozen: no count can be off
        return [f"Trainable set by module: all {tset['tensors']} tensors trainable."]
    head = f"Trainable set by module ({tset['trainable']} of {tset['tensors']} tensors trainable):"
    out = [head] + [f"  {line}" for line in lines[:cap]]
    if len(lines) > cap:
        out.append(f"  ... {len(lines) - cap} more (facts.trainable_set)")
    return out


def compact(tset: dict[str, Any], cap: int = 6) -> str:
    """One line: the stacks first (the counts a lock sets), then the regions."""
    lines = tset["stack_lines"] + [line for line in tset["lines"] if line not in tset["stack_lines"]]
    more = f"; {len(lines) - cap} more" if len(lines) > cap else ""
    return "; ".join(lines[:cap]) + more
