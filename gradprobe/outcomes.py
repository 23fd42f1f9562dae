"""How a check ran, as the checks need to know it: the target failed to build (GP100 target-load-failed), or a resource
limit stopped it (GP113 resource-limit).

Torch-free and process-free: the parent (a cgroup OOM kill it saw), the child's loaders and the
checks (an allocation a memory limit refused, recognised by checks/core/torchcompat.allocation_failure)
all report a limit through this one rule, so `checks/` needs nothing from `sandbox/`.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from typing import Any

from gradprobe.findings import Finding, Location, Rule, Situation

GP100: Rule[Any] = Rule(
    code="GP100", name="target-load-failed", severity="error", rank=1,
    summary="The target could not be imported or built.",
    why="Nothing can be measured on a model that does not load; the traceback shows the user's failing line.",
    example="build_model() raises, a syntax error in case.py, an import of a missing package.",
    message="The target failed while {phase}: {error}",
    fix="Fix the error in the traceback (user frames only), then call the tool again.",
    situations={
        "optimizer": Situation(
            when="make_optimizer (the target's optimizer callable) raised; the model loaded, so the other checks still ran",
            message="make_optimizer failed: {error}"),
        "step": Situation(
            when="the model built, then the user's step raised before backward() (the forward, the loss or a train_step)",
            message="{error}",
            fix="Fix the error in the traceback; the forward must run before gradients can be traced."),
        "after_backward": Situation(
            when="the user's step raised after a backward() that ran (in the optimizer step or the code after it)",
            message="The step raised after backward(): {error}",
            fix="Fix the error in the traceback (user frames only); the gradients of the backward() before it were "
                "traced."),
    },
)


def target_failed_finding(phase: str, error: Any, *, situation: str | None = None,
                          location: Location | Mapping[str, Any] | None = None,
                          evidence: Mapping[str, Any] | None = None) -> Finding:
    """GP100: the user's code raised while `phase` (importing, building the model, making the optimizer, ...)."""
    ev = {**(evidence or {}), **({"situation": situation} if situation else {})}  # the verdict reads what did not run
    return GP100.finding(situation, phase=phase, error=error, location=location, evidence=ev)


GP113: Rule[Any] = Rule(
    code="GP113", name="resource-limit", severity="warning", rank=3,
    summary="The check stopped at a memory limit (an allocation was refused, or the child was killed for memory).",
    why="A resource limit is neither a bug in the code nor in gradprobe: the finding says which limit was hit, in which "
        "phase and, when the allocator says it, how much was asked for. Nothing is claimed about the code, and the "
        "checks that needed what did not finish (the step, its gradients) did not run.",
    example="a model whose backward needs more memory than the sandbox's limit (on CPU the child's address space is capped "
            "at the server's memory limit: DefaultCPUAllocator: can't allocate memory)",
    message="A memory limit stopped the check while {phase}: {what}. This is a resource limit, not an error in the code: "
            "nothing is claimed about the code, and what needed this phase to finish was not checked.",
    fix="Check a smaller model or batch (a tiny config, fewer layers, a batch of 1-2), or raise the memory limit of the "
        "check: `\"memory_gb\": N` in the target, `gradprobe diagnose --memory-gb N` on the command line, `gradprobe serve "
        "--memory-gb N` for a server's default (by default the machine's memory less a quarter). GPU memory is not "
        "capped by gradprobe: on CUDA, free GPU memory or use a smaller model.",
    situations={
        "gpu": Situation(
            when="the GPU (or MPS device) ran out of memory",
            fix="Check a smaller model or batch, or free memory on the GPU (other processes, a larger card); "
                "gradprobe does not cap GPU memory, so --memory-gb does not change this."),
    },
)

_GIB = 1024**3


def size_text(n: int) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", _GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def address_space_limit() -> int | None:
    """This process's RLIMIT_AS (what the sandbox sets from the server's memory limit on CPU runs), None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _what_host(limit: Mapping[str, Any], asked: Any, ev: dict[str, Any]) -> str:
    device = limit.get("device")
    cap = address_space_limit() if device in ("cpu", "python") else None
    if cap is not None:
        ev["address_space_limit_bytes"] = cap
    by = "the CPU allocator" if device == "cpu" else "Python"
    refused = f"an allocation of {asked} was refused by {by}" if asked else f"an allocation was refused by {by}"
    return (refused + f" ({limit.get('exception')})"
            + (f"; the child's address space is capped at {size_text(cap)} (the server's memory limit on CPU runs)"
               if cap is not None else ""))


def resource_limit_finding(phase: str, limit: Mapping[str, Any], *, location: Location | Mapping[str, Any] | None = None,
                           evidence: Mapping[str, Any] | None = None) -> Finding:
    """GP113: a memory limit stopped the check while `phase`. `limit` is what was measured: torchcompat.allocation_failure's
    dict (an allocation refused in this process), or {"device": "cgroup", "memory_bytes": N} (the parent saw the kill)."""
    device = limit.get("device")
    asked = (f"{size_text(limit['requested_bytes'])} ({limit['requested_bytes']} bytes)" if limit.get("requested_bytes")
             else limit.get("requested"))
    ev: dict[str, Any] = {"phase": phase, "limit": dict(limit), **(evidence or {})}
    situation = None
    if device == "cgroup":
        cap = limit.get("memory_bytes")
        what = ("the child was killed by the sandbox's cgroup memory limit"
                + (f" ({size_text(cap)})" if cap else "") + " (the kernel's out-of-memory killer)")
    elif device in ("cuda", "mps"):
        what = (f"the {'GPU' if device == 'cuda' else 'MPS device'} ran out of memory"
                + (f" (an allocation of {asked} was refused)" if asked else "") + f": {limit.get('error')}")
        situation = "gpu"
    else:
        what = _what_host(limit, asked, ev)
    return GP113.finding(situation, phase=phase, what=what, location=location, evidence=ev)


def stopped_by_limit(findings: list[Finding]) -> bool:
    """Whether a resource limit stopped the check that produced these findings."""
    return any(f["code"] == GP113.code for f in findings)
