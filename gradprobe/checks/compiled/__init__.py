"""Compiled against eager (GP701, run by diagnose): for a model wrapped by torch.compile, every parameter's gradient
from the compiled module and from the eager module it wraps, and why they differ where dynamo's output can say.

    engine        measure both steps, the GP701 rule; compiled_findings is diagnose's entry
    compiled_why  why: a stale graph (the hook it lacks), a parameter no captured graph reads, a backend's op
    compiled_ops  the first op a backend computes differently from the same graph run op by op in eager
"""

from __future__ import annotations

from typing import Any

__all__ = ["compiled_findings"]


def __getattr__(name: str) -> Any:
    # the engine imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.compiled import engine

        return getattr(engine, name)
    raise AttributeError(name)
