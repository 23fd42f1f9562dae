"""Compiled against eager (GP701, run by diagnose): for a model wrapped by torch.compile, every parameter's gradient
from the compiled module and from the eager module it wraps, and why they differ where dynamo's output can say.

    engine        measure both steps, the GP701 rule; compiled_findings is diagnose's entry
    compiled_why  why: a stale graph (the hook it lacks), a parameter no captured graph reads, a backend's op
    compiled_ops  the first op a backend computes differently from the same graph run op by op in eager
"""

from gradprobe.checks.compiled.engine import compiled_findings

__all__ = ["compiled_findings"]
