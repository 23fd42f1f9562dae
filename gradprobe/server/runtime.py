"""Server-wide state shared by the tools: limits, allowed roots, the warm worker, and a fair pool.

The pool runs at most `max_concurrent` checks at once. Waiting calls form one FIFO
queue, but a caller never holds more than `per_caller` running slots, so one
person's burst cannot starve the others; while a call waits it is told how many
are ahead of it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field

import anyio

from gradprobe.sandbox.cgroups import clean_stale
from gradprobe.sandbox.runner import Limits, ToolInputError, child_env
from gradprobe.sandbox.warm import WarmWorker

PHASES = ("queued", "starting", "importing", "building", "checking")


@dataclass
class _Waiter:
    caller: str
    event: anyio.Event = field(default_factory=anyio.Event)


class Runtime:
    def __init__(self, max_concurrent: int | None = None, limits: Limits | None = None, warm: bool = True,
                 allowed_roots: list[str] | None = None, per_caller: int | None = None, allowed_pythons: list[str] | None = None,
                 executor=None):
        self.max_concurrent = max_concurrent or os.cpu_count() or 2
        self.per_caller = per_caller or self.max_concurrent  # stdio has one caller: no per-caller cap
        self.limits = limits or Limits()
        self.executor = executor  # None: children on this machine; else e.g. RayExecutor
        self.warm = WarmWorker(child_env(tempfile.gettempdir())) if warm and executor is None else None
        self.allowed_roots = [os.path.realpath(r) for r in (allowed_roots or [])]
        self.allowed_pythons = [os.path.realpath(p) for p in (allowed_pythons or [])]
        self.phase_total = float(len(PHASES))
        clean_stale()  # empty per-call cgroups a killed server left behind
        self._running: dict[str, int] = {}
        self._waiting: list[_Waiter] = []

    @property
    def running(self) -> int:
        return sum(self._running.values())

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def phase_index(self, phase: str) -> float:
        return float(PHASES.index(phase) + 1) if phase in PHASES else self.phase_total

    def check_target(self, target) -> None:
        """Refuse, before any child starts, a project outside every allowed root (symlinks and .. resolved)."""
        if not self.allowed_roots:
            return
        real = os.path.realpath(target.project_dir)
        if not any(real == root or real.startswith(root + os.sep) for root in self.allowed_roots):
            raise ToolInputError(f"project_dir {target.project_dir!r} (resolved: {real}) is outside the roots this server "
                                 f"may read: {', '.join(self.allowed_roots)}")
        if target.python is not None:
            py = os.path.realpath(target.python)
            inside = any(py.startswith(root + os.sep) for root in self.allowed_roots)
            if not inside and py not in self.allowed_pythons:
                raise ToolInputError(f"python {target.python!r} is neither inside an allowed root nor an interpreter the operator allowed")

    def _can_run(self, caller: str) -> bool:
        return self.running < self.max_concurrent and self._running.get(caller, 0) < self.per_caller

    def _wake(self) -> None:
        """Start waiters in FIFO order, skipping callers at their cap, while slots are free."""
        for w in list(self._waiting):
            if self.running >= self.max_concurrent:
                return
            if self._can_run(w.caller):
                self._waiting.remove(w)
                self._running[w.caller] = self._running.get(w.caller, 0) + 1
                w.event.set()

    @contextlib.asynccontextmanager
    async def slot(self, ctx, caller: str = "local"):
        """Wait for a slot (telling the caller how many are ahead), then hold it."""
        if self._can_run(caller) and not any(self._can_run(w.caller) for w in self._waiting):
            self._running[caller] = self._running.get(caller, 0) + 1
        else:
            w = _Waiter(caller)
            self._waiting.append(w)
            try:
                while not w.event.is_set():
                    ahead = self._waiting.index(w) if w in self._waiting else 0
                    if ctx is not None:
                        try:
                            await ctx.report_progress(0, total=self.phase_total, message=f"waiting: {ahead + 1} ahead of you")
                        except Exception:
                            pass
                    with anyio.move_on_after(1.0):
                        await w.event.wait()
            except BaseException:
                if w in self._waiting:
                    self._waiting.remove(w)
                elif w.event.is_set():
                    self._release(caller)
                raise
        try:
            yield
        finally:
            self._release(caller)

    def _release(self, caller: str) -> None:
        self._running[caller] = self._running.get(caller, 1) - 1
        if self._running[caller] <= 0:
            self._running.pop(caller, None)
        self._wake()
