"""DataLoader workers that run a Dataset holding tensors that require grad: samples cross a process boundary.

Measured after the step from the loaders the recording mode saw iterated (GP309 reads it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.step import StepResult
from gradprobe.checks.trace.candidates import Location
from gradprobe.checks.trace.recording import GradTracer
from gradprobe.userframes import UserCode


@dataclass
class WorkerCrossing:
    """A loader whose worker processes build samples from tensors that require grad."""

    dataset: str  # the Dataset's class name
    num_workers: int
    names: list[str]  # the learnable tensors it holds (parameter names where they are the model's)
    where: Location | None  # the Dataset's line that reads them
    iterated_at: Location | None  # the user line that iterated the loader
    worker_error: str | None  # the step failed in a worker (batching samples that require grad)


def _items(obj: Any) -> list[tuple[Any, Any]] | None:
    if isinstance(obj, dict):
        return list(obj.items())[:64]
    if isinstance(obj, (list, tuple)):
        return list(enumerate(obj))[:64]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return list(vars(obj).items())
    return None


def _learnable_in(obj: Any, path: str, depth: int, seen: set[int], out: list[tuple[str, torch.Tensor]]) -> None:
    """Tensors that require grad reachable from a Dataset's attributes (modules' parameters included)."""
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append((path, obj))
        return
    if isinstance(obj, nn.Module):
        out.extend((f"{path}.{n}", p) for n, p in obj.named_parameters() if p.requires_grad)
        return
    for k, v in _items(obj) or ():
        if isinstance(v, (torch.Tensor, nn.Module, dict, list, tuple)) or hasattr(v, "__dict__"):
            _learnable_in(v, f"{path}.{k}", depth + 1, seen, out)


def _dataset_line(dataset: Any, ids: set[int], user: UserCode) -> Location | None:
    """Where the Dataset's own code reads the learnable tensors: its first sample, fetched once in this process."""
    getitem = getattr(type(dataset), "__getitem__", None)
    code = getattr(getitem, "__code__", None)
    hit: list[Location | None] = []

    class FirstRead(TorchFunctionMode):
        def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            if not hit and any(id(a) in ids for a in list(args) + list((kwargs or {}).values())):
                f: FrameType | None = sys._getframe(1)
                while f is not None and f.f_code is not code:
                    f = f.f_back
                hit.append(user.location_of(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) if f is not None
                           else user.innermost(skip=2))
            return func(*args, **(kwargs or {}))

    def returned(frame: FrameType, event: str, arg: Any) -> None:  # handed out as they are: the `return` is the line
        if event == "return" and frame.f_code is code and not hit:
            vals = arg if isinstance(arg, (tuple, list)) else list(arg.values()) if isinstance(arg, dict) else [arg]
            if any(id(v) in ids for v in vals):
                hit.append(user.location_of(code.co_filename, frame.f_lineno, code.co_name))

    if code is None:
        return None
    old_profile = sys.getprofile()
    try:
        sys.setprofile(returned)
        with torch.no_grad(), FirstRead():
            dataset[0]
    except Exception:
        pass
    finally:
        sys.setprofile(old_profile)
    return hit[0] if hit else None


def worker_crossings(tracer: GradTracer, names: dict[int, list[str]], step: StepResult,
                     wanted: Callable[[str], bool]) -> list[WorkerCrossing]:
    """Every iterated loader with workers whose Dataset holds tensors that require grad (of the wanted names)."""
    out: list[WorkerCrossing] = []
    for loader, iterated_at in tracer.loaders:
        if not getattr(loader, "num_workers", 0):
            continue
        dataset = getattr(loader, "dataset", None)
        found: list[tuple[str, torch.Tensor]] = []
        _learnable_in(dataset, "dataset", 0, set(), found)
        if not found:
            continue
        pnames = [names[id(t)][0] if id(t) in names else p for p, t in found]
        pnames = [n for n in dict.fromkeys(pnames) if wanted(n)]
        if not pnames:
            continue
        where = _dataset_line(dataset, {id(t) for _, t in found}, tracer.user)
        err = step.error
        worker_error = (f"{type(err).__name__}: {str(err).splitlines()[0]}"
                        if err is not None and "DataLoader worker" in str(err) else None)
        out.append(WorkerCrossing(type(dataset).__name__, loader.num_workers, pnames, where, iterated_at, worker_error))
    return out
