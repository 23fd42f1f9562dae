"""Every serving option in one typed value, built by the command line (cli.py) and read by both transports."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gradprobe.sandbox.cgroup_tree import bounding_memory
from gradprobe.sandbox.roots import resolved_inside
from gradprobe.sandbox.runner import Limits

if TYPE_CHECKING:
    from gradprobe.sandbox.executor import Executor
    from gradprobe.sandbox.interpreter import InterpreterPolicy

GIB = 1024**3


def machine_memory_bytes() -> int | None:
    """What this process may use: the machine's memory, or the limit of the cgroup that bounds it when lower."""
    total = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    limits = [x for x in [total, bounding_memory()] if x]
    return min(limits) if limits else None


def default_budget_bytes() -> int | None:
    """What all checks together may use (one budget, Runtime): what the machine (or the cgroup that bounds the server)
    has, less room for the server itself (a quarter, at least 2 GiB); None when that cannot be read."""
    have = machine_memory_bytes()
    if not have:
        return None
    return max(GIB, have - max(2 * GIB, have // 4))


def default_memory_bytes() -> int:
    """One check alone (the command line): the whole budget; 8 GiB when the machine's memory cannot be read."""
    return default_budget_bytes() or 8 * GIB


def memory_settings(pool: int, memory_gb: float | None, max_memory_gb: float | None, budget_gb: float | None,
                    local: bool = True) -> tuple[int, int | None, int | None] | str:
    """The command line's memory flags as (each check's default cap, the most a target may ask for, the budget for all
    checks together as given), or why they cannot hold. The default cap is the budget over the slots, so the checks
    that run at once never hold more than the budget (a check that asks for more waits: Runtime.slot)."""
    have, given = machine_memory_bytes(), int(budget_gb * GIB) if budget_gb else None
    if given and have and given > have:
        return (f"--memory-budget-gb {budget_gb:g} is more than this machine (or the cgroup that bounds this server) "
                f"has ({have / GIB:.1f} GB)")
    budget = given or default_budget_bytes()
    if not local:  # a Ray cluster: each check runs on a worker of its own, with this machine's size as its default
        return (int(memory_gb * GIB) if memory_gb else default_memory_bytes()), (
            int(max_memory_gb * GIB) if max_memory_gb else None), given
    per_call = int(memory_gb * GIB) if memory_gb else (budget // max(1, pool) if budget else 8 * GIB)
    for flag, value in (("--memory-gb", memory_gb), ("--max-memory-gb", max_memory_gb)):
        if value and budget and value * GIB > budget:
            return (f"{flag} {value:g} is more than the memory all checks together may use ({budget / GIB:.1f} GB: "
                    "this machine's or the server's cgroup's memory less room for the server; --memory-budget-gb)")
    return per_call, (int(max_memory_gb * GIB) if max_memory_gb else None), given


@dataclass(frozen=True)
class HttpOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    token_file: str | None = None
    insecure_no_auth: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_body: int = 1024 * 1024
    public_url: str | None = None
    issuer_url: str | None = None
    max_connections: int = 256
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0


@dataclass(frozen=True)
class ServeOptions:
    max_concurrent: int | None = None  # None: one per core
    per_caller: int | None = None  # None: half the pool over HTTP (at least 1), the whole pool over stdio
    warm: bool = True
    allowed_roots: tuple[str, ...] = ()  # empty: no limit over stdio; the working directory over HTTP
    allowed_pythons: tuple[str, ...] = ()
    allowed_env: tuple[str, ...] = ()  # variable names a target's `env` may set over HTTP
    user_roots: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (user, that user's own roots) from the token file
    max_memory_bytes: int | None = None  # the ceiling a target's `memory_gb` may ask for (None: the budget)
    memory_budget_bytes: int | None = None  # all checks together (None: sized from the machine or the server's cgroup)
    limits: Limits = field(default_factory=Limits)
    executor: str = "local"  # or "ray"
    ray_address: str = "local"
    http: HttpOptions | None = None  # None: stdio

    @property
    def pool(self) -> int:
        return self.max_concurrent or os.cpu_count() or 2

    @property
    def caller_cap(self) -> int:
        if self.per_caller:
            return self.per_caller
        return max(1, self.pool // 2) if self.http is not None else self.pool

    @property
    def roots(self) -> list[str]:
        if self.allowed_roots:
            return [os.path.realpath(r) for r in self.allowed_roots]
        return [os.path.realpath(os.getcwd())] if self.http is not None else []

    def roots_for(self, caller: str) -> list[str]:
        """The roots one caller's calls may read: that user's own from the token file, else the server's."""
        own = dict(self.user_roots).get(caller)
        return [os.path.realpath(r) for r in own] if own else self.roots

    @property
    def budget(self) -> int | None:
        """The memory all checks together may hold (each running check holds its own cap of it)."""
        return self.memory_budget_bytes or default_budget_bytes()

    @property
    def memory_ceiling(self) -> int:
        """The most one check may ask for: --max-memory-gb, never more than the budget for all of them."""
        budget = self.budget
        cap = self.max_memory_bytes or budget or max(8 * GIB, self.limits.memory_bytes or 0)
        return min(cap, budget) if budget else cap

    def refuse(self, target: Any, roots: list[str] | None = None) -> str | None:
        """Why this server will not run a target's own settings (read_paths, env, memory_gb), or None. Over HTTP (or with
        allowed roots), read_paths only inside the roots (the caller's: `roots`); over HTTP, env only with names the
        operator allowed."""
        roots = self.roots if roots is None else roots
        for path in target.read_paths:
            if roots and not resolved_inside(path, roots):
                return f"read_paths: {path!r} is outside the roots this server may read: {', '.join(roots)}"
        names = sorted(set(target.env) - set(self.allowed_env))
        if self.http is not None and names:
            return (f"env: this server does not let callers set {', '.join(names)} (its operator allows: "
                    f"{', '.join(self.allowed_env) or 'none'}; gradprobe serve --allow-env NAME)")
        if target.memory_gb and target.memory_gb * GIB > self.memory_ceiling:
            budget = self.budget
            shared = f"; all checks together share {budget / GIB:.1f} GB (--memory-budget-gb)" if budget else ""
            return (f"memory_gb: {target.memory_gb:g} GB is more than this server allows per check "
                    f"({self.memory_ceiling / GIB:.1f} GB, its operator sets it with --max-memory-gb{shared})")
        return None

    def interpreter_policy(self) -> InterpreterPolicy:
        """Which interpreters targets may run (sandbox/interpreter.py): with allowed roots (always over HTTP), a named
        one only when listed with --allow-python, a project's own only inside a root or listed."""
        from gradprobe.sandbox.interpreter import InterpreterPolicy

        roots = self.roots
        return InterpreterPolicy.make(roots, self.allowed_pythons, strict=bool(roots))

    def make_executor(self) -> Executor:
        """The Executor (sandbox/executor.py) these options ask for."""
        if self.executor == "ray":
            from gradprobe.sandbox.ray_executor import RayExecutor

            return RayExecutor(self.ray_address, num_cpus=self.max_concurrent, limits=self.limits, allowed_roots=self.roots)
        from gradprobe.sandbox.executor import LocalExecutor

        return LocalExecutor(self.limits, warm=self.warm, allowed_roots=self.roots)
