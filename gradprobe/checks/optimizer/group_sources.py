"""Where an optimizer's param groups and learning rates came from, recorded while the user's make_optimizer runs.

`GroupRecorder` notes, for each param-group dict handed to an optimizer, the user function and line that built it
(a layer-decay helper, a dict literal in make_optimizer), the keys it was given, the user line of the
`add_param_group` call; the schedulers built over an optimizer (and their lambdas); and, when torch refuses a group
for holding parameters another group already holds, the groups as they stood. Facts only: the rules that read them
are in checks/optimizer/engine.py and checks/optimizer/several_optimizers.py.
"""

from __future__ import annotations

import ast
import linecache
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Literal

import torch

from gradprobe.checks.core.torchcompat import OPTIMIZER_PARAM_IN_SEVERAL_GROUPS
from gradprobe.userframes import UserCode, location

Loc = dict[str, Any]


@dataclass
class GroupSources:
    """What the recorder saw: keyed by id() of objects it keeps alive in `keep`."""

    built_by: dict[int, Loc] = field(default_factory=dict)  # id(group dict) -> the user line that built it
    keys: dict[int, list[str]] = field(default_factory=dict)  # id(group dict) -> its keys as the user gave them
    schedulers: list[tuple[Any, Loc | None]] = field(default_factory=list)  # (scheduler, the user line that built it)
    refused: tuple[list[dict[str, Any]], dict[str, Any]] | None = None  # (groups already added, the refused one)
    returned: list[Any] = field(default_factory=list)  # optimizers a user function returned (make_optimizer's tuple)
    zero_returns: dict[str, Loc] = field(default_factory=dict)  # user function name -> its return line that gave 0
    keep: list[Any] = field(default_factory=list)

    def source_of(self, group: dict[str, Any]) -> Loc | None:
        return self.built_by.get(id(group))

    def zero_lr_callee(self, built: Loc) -> tuple[str, Loc] | None:
        """The user function that returned 0 while building this group's lr: one the group literal's `lr` value calls
        (directly, or through a local variable assigned from it in the same function), and that returned exactly 0."""
        for name in lr_callees(built["file"], built["line"]):
            if name in self.zero_returns:
                return name, self.zero_returns[name]
        return None


def _group_literals(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """(line, constant keys) of each `{"params": ...}` literal or `dict(params=...)` call under `tree`."""
    out: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            keys = [k.arg for k in node.keywords if k.arg]
        else:
            continue
        if "params" in keys:
            out.append((node.lineno, keys))
    return sorted(out)


def _called(node: ast.AST) -> list[str]:
    names = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            names += [f.id] if isinstance(f, ast.Name) else [f.attr] if isinstance(f, ast.Attribute) else []
    return names


def _lr_value(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Dict):
        return next((v for k, v in zip(node.keys, node.values, strict=True)
                     if isinstance(k, ast.Constant) and k.value == "lr"), None)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return next((k.value for k in node.keywords if k.arg == "lr"), None)
    return None


def lr_callees(filename: str, line: int) -> list[str]:
    """The functions the `lr` of the group literal at `line` calls: in the value itself, then in the assignments (in the
    enclosing function) of the local names the value reads (`scale = layer_scale(d)`; `{"lr": base * scale}`)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return []
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.lineno <= line <= (n.end_lineno or n.lineno)]
    scope = min(funcs, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if funcs else tree
    value = next((v for n in ast.walk(scope) if getattr(n, "lineno", None) == line
                  for v in [_lr_value(n)] if v is not None), None)
    if value is None:
        return []
    names, read = _called(value), {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    for n in ast.walk(scope):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in read for t in n.targets):
            names += _called(n.value)
    return names


def _is_zero(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        return False
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.requires_grad and float(value) == 0.0
    return value == 0


def _function_node(filename: str, first_line: int) -> ast.AST | None:
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and (n.lineno == first_line or (n.decorator_list and n.decorator_list[0].lineno == first_line))), None)


def literal_line(frame: FrameType, keys: list[str], used: set[int]) -> int:
    """The line of the group literal in `frame`'s function whose keys match `keys`: the first one not in `used` (the
    lines already given to this frame's earlier groups), else the first; else the frame's current line."""
    code = frame.f_code
    node = _function_node(code.co_filename, code.co_firstlineno)
    found = _group_literals(node) if node is not None else []
    same = [ln for ln, k in found if sorted(k) == sorted(keys)] or [ln for ln, _ in found]
    return next((ln for ln in same if ln not in used), same[0]) if same else frame.f_lineno


def _groups_in(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value] if "params" in value else []
    if isinstance(value, (list, tuple)):
        return [v for v in value[:10000] if isinstance(v, dict) and "params" in v]
    return []


class GroupRecorder:
    """Context manager: records the sources of param groups and the schedulers built while it is active."""

    def __init__(self, user: UserCode, sources: GroupSources) -> None:
        self.user, self.sources = user, sources
        self._used: dict[int, set[int]] = {}  # id(frame) -> the literal lines its groups were given

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "return" or not self.user.is_user_file(frame.f_code.co_filename):
            return
        src = self.sources
        if _is_zero(arg) and frame.f_code.co_name not in src.zero_returns:  # a layer-decay helper's 0, say
            code = frame.f_code
            src.zero_returns[code.co_name] = location(code.co_filename, frame.f_lineno, code.co_name)
        for opt in (arg if isinstance(arg, (tuple, list)) else arg.values() if isinstance(arg, dict) else [arg]):
            if isinstance(opt, torch.optim.Optimizer) and all(o is not opt for o in src.returned):
                src.returned.append(opt)
        for value in list(frame.f_locals.values()) + [arg]:
            for group in _groups_in(value):
                if id(group) not in src.built_by:
                    self._built(frame, group, src.keys.get(id(group), [str(k) for k in group]))

    def _built(self, frame: FrameType, group: dict[str, Any], keys: list[str]) -> None:
        used = self._used.setdefault(id(frame), set())
        line = literal_line(frame, keys, used)
        used.add(line)
        name = frame.f_code.co_filename  # the literal's own line, not its statement's first: `location` would move it
        self.sources.built_by[id(group)] = {"file": name, "line": line, "function": frame.f_code.co_name,
                                            "code": linecache.getline(name, line).strip()}
        self.sources.keep.append(group)

    def _user_frame(self) -> FrameType | None:
        f: FrameType | None = sys._getframe(2)
        while f is not None and not self.user.is_user_file(f.f_code.co_filename):
            f = f.f_back
        return f

    def __enter__(self) -> GroupRecorder:
        src, user = self.sources, self.user
        self._add = orig_add = torch.optim.Optimizer.add_param_group
        self._sched = orig_sched = torch.optim.lr_scheduler.LRScheduler.__init__

        def add_param_group(opt: torch.optim.Optimizer, group: dict[str, Any]) -> None:
            if isinstance(group, dict) and id(group) not in src.keys:
                src.keys[id(group)] = [str(k) for k in group]
                frame = self._user_frame()
                if id(group) not in src.built_by and frame is not None:  # a literal in the call's own statement
                    self._built(frame, group, src.keys[id(group)])
            try:
                return orig_add(opt, group)
            except ValueError as exc:
                if OPTIMIZER_PARAM_IN_SEVERAL_GROUPS in str(exc) and isinstance(group, dict):
                    src.refused = (list(opt.param_groups), group)
                raise

        def scheduler_init(sched: Any, *args: Any, **kwargs: Any) -> None:
            orig_sched(sched, *args, **kwargs)
            src.schedulers.append((sched, user.innermost(skip=2)))

        self._previous = sys.getprofile()
        torch.optim.Optimizer.add_param_group = add_param_group  # type: ignore[method-assign, assignment]
        torch.optim.lr_scheduler.LRScheduler.__init__ = scheduler_init  # type: ignore[method-assign, assignment]
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        sys.setprofile(self._previous)
        torch.optim.Optimizer.add_param_group = self._add  # type: ignore[method-assign]
        torch.optim.lr_scheduler.LRScheduler.__init__ = self._sched  # type: ignore[method-assign]
        return False


# ---- reading what was recorded ----------------------------------------------------------------------------------

@dataclass
class LrSource:
    """Why a group's lr is 0: a scheduler (its lambda's line, and whether it rises later) or the group's builder."""

    kind: str  # "scheduler_rises", "scheduler_stays", "scheduled", "decay_function" or "built"
    location: Loc | None
    detail: dict[str, Any] = field(default_factory=dict)


PROBE_STEPS = (1, 10, 100, 1000)


def _lambda_site(fn: Any) -> Loc | None:
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    return location(code.co_filename, code.co_firstlineno, code.co_name)


def _probe(fn: Any) -> list[tuple[int, float]] | None:
    try:
        return [(k, float(fn(k))) for k in PROBE_STEPS]
    except Exception:  # a lambda that needs state we do not have: not judged
        return None


def scheduler_source(sources: GroupSources | None, optimizer: Any, gi: int) -> LrSource | None:
    """The scheduler that set group `gi` of `optimizer` to lr 0, and whether its factor rises over later steps."""
    if sources is None:
        return None
    group = optimizer.param_groups[gi]
    for sched, site in sources.schedulers:
        if getattr(sched, "optimizer", None) is not optimizer or not group.get("initial_lr"):
            continue
        lambdas = getattr(sched, "lr_lambdas", None)
        if not lambdas or gi >= len(lambdas):
            return LrSource("scheduled", site, {"scheduler": type(sched).__name__, "initial_lr": group["initial_lr"]})
        fn = lambdas[gi]
        later = _probe(fn)
        where = _lambda_site(fn) or site
        detail = {"scheduler": type(sched).__name__, "initial_lr": group["initial_lr"], "scheduler_at": site,
                  "factor_at_step": later}
        if later is not None and any(v > 0 for _, v in later):
            return LrSource("scheduler_rises", where, detail)
        return LrSource("scheduler_stays" if later is not None else "scheduled", where, detail)
    return None
