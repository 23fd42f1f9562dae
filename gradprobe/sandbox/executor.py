"""Where a sandboxed job runs: the `Executor` protocol, and the local implementation (warm worker or cold child).

The Ray implementation (`ray_executor.RayExecutor`) runs the same local executor on
a cluster worker. The server holds one executor and never needs to know which.
"""

from __future__ import annotations

from typing import Protocol

from gradprobe.sandbox.interpreter import Interpreter
from gradprobe.sandbox.protocol import Job
from gradprobe.sandbox.runner import ChildOutcome, Limits, ProgressFn, child_env, run_child
from gradprobe.sandbox.warm import WarmWorker


class Executor(Protocol):
    limits: Limits

    async def run(self, job: Job, *, python: str | None, timeout_s: float, progress: ProgressFn | None = None,
                  limits: Limits | None = None, allowed_roots: list[str] | None = None) -> ChildOutcome: ...

    async def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def warm_alive(self) -> bool: ...


class LocalExecutor:
    """Children on this machine: forked from a warm worker (when `warm`) or launched cold; both confined."""

    def __init__(self, limits: Limits | None = None, warm: bool = False, allowed_roots: list[str] | None = None) -> None:
        self.limits = limits or Limits()
        self.allowed_roots = list(allowed_roots or [])
        self.warm = WarmWorker(child_env("/tmp")) if warm else None

    async def run(self, job: Job, *, python: str | Interpreter | None, timeout_s: float, progress: ProgressFn | None = None,
                  limits: Limits | None = None, allowed_roots: list[str] | None = None) -> ChildOutcome:
        """`python`: an interpreter already resolved and held open (executed as that very file), a path (resolved
        here), or None for the server's own. `allowed_roots`: the caller's own roots (default: the server's)."""
        roots = self.allowed_roots if allowed_roots is None else allowed_roots
        return await run_child(job, python=python, timeout_s=timeout_s, limits=limits or self.limits, progress=progress,
                               warm=self.warm, allowed_roots=roots)

    async def start(self) -> None:
        if self.warm is not None:
            await self.warm.ensure()

    def stop(self) -> None:
        if self.warm is not None:
            self.warm.stop()

    @property
    def warm_alive(self) -> bool:
        return bool(self.warm is not None and self.warm.alive)
