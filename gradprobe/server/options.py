"""Every serving option in one typed value, built by the command line (cli.py) and read by both transports."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gradprobe.sandbox.runner import Limits


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

    def interpreter_policy(self):
        """Which interpreters targets may run (sandbox/interpreter.py): with allowed roots (always over HTTP), a named
        one only when listed with --allow-python, a project's own only inside a root or listed."""
        from gradprobe.sandbox.interpreter import InterpreterPolicy

        roots = self.roots
        return InterpreterPolicy.make(roots, self.allowed_pythons, strict=bool(roots))

    def make_executor(self):
        """The Executor (sandbox/executor.py) these options ask for."""
        if self.executor == "ray":
            from gradprobe.sandbox.ray_executor import RayExecutor

            return RayExecutor(self.ray_address, num_cpus=self.max_concurrent, limits=self.limits, allowed_roots=self.roots)
        from gradprobe.sandbox.executor import LocalExecutor

        return LocalExecutor(self.limits, warm=self.warm, allowed_roots=self.roots)
