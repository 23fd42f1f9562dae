"""Server-wide state shared by the tools: limits, allowed roots, the warm worker, and a fair pool.

The pool runs at most `max_concurrent` checks at once. Waiting calls form one FIFO
queue, but a caller never holds more than `per_caller` running slots, so one
person's burst cannot starve the others; while a call waits it is told how many
are ahead of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any
import os
from dataclasses import dataclass, field

import anyio

from gradprobe.sandbox.cgroup_tree import make_subtree, placement, remove_subtree
from gradprobe.sandbox.cgroups import clean_stale, server_dir_name
from gradprobe.sandbox.executor import Executor
from gradprobe.sandbox.interpreter import InterpreterPolicy
from gradprobe.sandbox.roots import resolved_inside
from gradprobe.errors import ToolInputError
from gradprobe.sandbox.protocol import PROGRESS_STEPS as PHASES
from gradprobe.server.options import GIB, ServeOptions


@dataclass
class _Waiter:
    caller: str
    memory: int = 0
    event: anyio.Event = field(default_factory=anyio.Event)


class Runtime:
    def __init__(self, options: ServeOptions | None = None, executor: Executor | None = None, **overrides: Any):
        """`options` as the command line built them (ServeOptions fields may also be given as keywords)."""
        options = options or ServeOptions()
        if overrides:
            import dataclasses

            fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
            options = dataclasses.replace(options, **fields)
        self.options = options
        self.max_concurrent = options.pool
        self.per_caller = options.caller_cap
        self.limits = options.limits
        self.allowed_roots = options.roots
        self.allowed_pythons = [os.path.realpath(p) for p in options.allowed_pythons]
        self.interpreters = options.interpreter_policy()
        self.executor: Executor = executor or options.make_executor()
        self.phase_total = float(len(PHASES))
        clean_stale()  # cgroup subtrees of gradprobe servers that are gone
        # one memory budget for every call on this machine together (a Ray cluster's workers have their own)
        self.budget: int | None = options.budget if options.executor == "local" else None
        self.held_memory = 0
        if self.limits.isolate and options.executor == "local":  # the calls' subtree, bounded by the budget
            make_subtree(server_dir_name(), placement(), self.budget)
        self._running: dict[str, int] = {}
        self._waiting: list[_Waiter] = []

    def close(self) -> None:
        """The server is stopping: its executor, then its (empty) cgroup subtree."""
        self.executor.stop()
        remove_subtree(server_dir_name(), placement())

    @property
    def running(self) -> int:
        return sum(self._running.values())

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def phase_index(self, phase: str) -> float:
        return float(PHASES.index(phase) + 1) if phase in PHASES else self.phase_total

    def roots_for(self, caller: str) -> list[str]:
        """The roots `caller`'s calls may read: their own from the token file, else the server's (ServeOptions)."""
        return self.options.roots_for(caller)

    def interpreters_for(self, caller: str) -> InterpreterPolicy:
        """Which interpreters `caller`'s calls accept: the server's policy, over that caller's roots."""
        roots = tuple(self.roots_for(caller))
        if roots == self.interpreters.roots:
            return self.interpreters
        return dataclasses.replace(self.interpreters, roots=roots, strict=self.interpreters.strict or bool(roots))

    def check_target(self, target: Any, caller: str = "local") -> None:
        """Refuse, before any child starts and before anything about the path is looked at, a project or a model
        file outside every root of this caller (symlinks and .. resolved): one answer whether it exists or not. The
        child checks the project again on the directory it opens (confine.py)."""
        roots = self.roots_for(caller)
        refused = self.options.refuse(target, roots)  # the target's read_paths, env and memory_gb
        if refused:
            raise ToolInputError(refused)
        if not roots:
            return
        refs = [getattr(target, f) for f in ("model", "inputs", "loss", "optimizer", "train_step")]
        files = [os.path.join(target.project_dir, r.partition(":")[0]) for r in refs if r and r.partition(":")[0].endswith(".py")]
        for path in [target.project_dir, *files]:
            if not os.path.isabs(target.project_dir) or not resolved_inside(path, roots):
                raise ToolInputError(f"{path!r} is outside the roots this server may read: {', '.join(roots)}")
        # the interpreter (named or found) is checked where it is resolved, once: sandbox/interpreter.py

    def memory_for(self, target: Any) -> int:
        """What one call holds of the budget: its own `memory_gb`, else the per-call default (budget / slots)."""
        need = int(target.memory_gb * GIB) if getattr(target, "memory_gb", None) else int(self.limits.memory_bytes or 0)
        return min(need, self.budget) if self.budget is not None else need

    def _fits(self, memory: int) -> bool:
        return self.budget is None or self.held_memory + memory <= self.budget

    def _under_cap(self, caller: str) -> bool:
        return self._running.get(caller, 0) < self.per_caller

    def _can_run(self, caller: str, memory: int = 0) -> bool:
        return self.running < self.max_concurrent and self._under_cap(caller) and self._fits(memory)

    def _take(self, caller: str, memory: int) -> None:
        self._running[caller] = self._running.get(caller, 0) + 1
        self.held_memory += memory

    def _wake(self) -> None:
        """Start waiters in FIFO order while slots are free, skipping callers at their cap; a waiter whose memory does
        not fit yet stops the others behind it (a big call is never starved by small ones)."""
        for w in list(self._waiting):
            if self.running >= self.max_concurrent:
                return
            if not self._under_cap(w.caller):
                continue
            if not self._fits(w.memory):
                return
            self._waiting.remove(w)
            self._take(w.caller, w.memory)
            w.event.set()

    def _waiting_line(self, w: _Waiter) -> str:
        ahead = self._waiting.index(w) if w in self._waiting else 0
        if ahead == 0 and self.running < self.max_concurrent and self._under_cap(w.caller) and self.budget is not None:
            return (f"waiting for memory: this check asks for {w.memory / GIB:.1f} GB; running checks hold "
                    f"{self.held_memory / GIB:.1f} GB of this server's {self.budget / GIB:.1f} GB for all checks")
        return f"waiting: {ahead + 1} ahead of you"

    @contextlib.asynccontextmanager
    async def slot(self, ctx: Any, caller: str = "local", memory: int = 0) -> AsyncIterator[None]:
        """Wait for a slot and `memory` of the budget (telling the caller why it waits), then hold both."""
        if self._can_run(caller, memory) and not any(self._under_cap(w.caller) for w in self._waiting):
            self._take(caller, memory)
        else:
            w = _Waiter(caller, memory)
            self._waiting.append(w)
            try:
                while not w.event.is_set():
                    if ctx is not None:
                        try:
                            await ctx.report_progress(0, total=self.phase_total, message=self._waiting_line(w))
                        except Exception:
                            pass
                    with anyio.move_on_after(1.0):
                        await w.event.wait()
            except BaseException:
                if w in self._waiting:
                    self._waiting.remove(w)
                    self._wake()
                elif w.event.is_set():
                    self._release(caller, memory)
                raise
        try:
            yield
        finally:
            self._release(caller, memory)

    def _release(self, caller: str, memory: int = 0) -> None:
        self.held_memory -= memory
        self._running[caller] = self._running.get(caller, 1) - 1
        if self._running[caller] <= 0:
            self._running.pop(caller, None)
        self._wake()
