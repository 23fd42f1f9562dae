"""Run sandboxed jobs on a Ray cluster: one Ray task per call, the same sandboxed child inside it.

For teams whose models need more GPUs than one box has. Each task runs
`run_child` on whichever worker Ray picks (asking for a GPU when the target's
device wants CUDA), so isolation, limits and timeouts are the same as locally,
and it returns the same JSON. The target's project_dir must be visible at the
same path on the workers (a shared file system). Cancelling the MCP call cancels
the Ray task; a worker that dies becomes a GP116 finding saying so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import shutil
import tempfile
from typing import Any

from gradprobe.render import clean
from gradprobe.sandbox.protocol import Job, Phase
from gradprobe.sandbox.runner import OUTPUT_CAP, PROGRESS_CAP, RESULT_CAP, ChildOutcome, Limits, ProgressFn

WIRE_CAP = RESULT_CAP + 4 * OUTPUT_CAP + 64 * 1024  # a result, stdout and stderr (escaped), and the rest


def _remote_job(job: Job, python: str | None, timeout_s: float, limits: dict[str, Any], allowed_roots: list[str]) -> bytes:
    from gradprobe.sandbox.runner import Limits as L
    from gradprobe.sandbox.runner import run_child

    outcome = asyncio.run(run_child(job, python=python, timeout_s=timeout_s, limits=L(**limits), allowed_roots=allowed_roots))
    return json.dumps(dataclasses.asdict(outcome), default=str).encode()


def parse_outcome(data: object) -> ChildOutcome:
    """A task's result: JSON bytes, size-capped and read field by field with their types; anything else is refused."""
    if not isinstance(data, bytes) or len(data) > WIRE_CAP:
        raise ValueError("the Ray task returned no result of the expected form (JSON bytes within the size cap)")
    raw = json.loads(data)
    if not isinstance(raw, dict):
        raise ValueError("the Ray task's result is not a JSON object")

    def text(key: str, cap: int, default: str | None = "") -> str | None:
        v = raw.get(key)
        return v[:cap] if isinstance(v, str) else default

    def number(key: str) -> Any:
        v = raw.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def mapping(key: str) -> dict[str, Any]:
        v = raw.get(key)
        return v if isinstance(v, dict) else {}

    code = number("returncode")
    return ChildOutcome(
        report=raw["report"] if isinstance(raw.get("report"), dict) else None,
        tool_error=text("tool_error", 2000, None), phase=_phase(raw.get("phase")),
        returncode=int(code) if code is not None else None, timed_out=raw.get("timed_out") is True,
        stdout=text("stdout", 2 * OUTPUT_CAP) or "", stderr=text("stderr", 2 * OUTPUT_CAP) or "",
        seconds=float(number("seconds") or 0.0),
        events=[clean(e)[:40] for e in raw.get("events") or [] if isinstance(e, str)][:PROGRESS_CAP]
        if isinstance(raw.get("events"), list) else [],
        mode="ray", note=text("note", 2000, None), oom=raw.get("oom") is True,
        isolation=_isolation(mapping("isolation")),
        tool_error_kind="interpreter" if raw.get("tool_error_kind") == "interpreter" else "caller",
        start_error=text("start_error", 2000, None),
    )


def _phase(value: object) -> Phase:
    """A phase the task named, if it is one; else the parent's own word for a remote call."""
    try:
        return Phase(value)
    except ValueError:
        return Phase.REMOTE


def _isolation(iso: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, dict[str, str]] = {}
    for key in ("applied", "verified_by_server"):
        part = iso.get(key)
        out[key] = {str(a): str(b)[:300] for a, b in part.items()} if isinstance(part, dict) else {}
    return out


def token_auth_available() -> bool:
    """Whether the installed Ray has token authentication (RAY_AUTH_MODE=token)."""
    try:
        import ray._private.authentication.authentication_token_setup  # noqa: F401
    except ImportError:
        return False
    return True


class RayExecutor:
    """The `Executor` protocol (executor.py) on a Ray cluster.

    `address` "local" (or None) starts a private Ray instance for this server: explicitly (never whatever
    RAY_ADDRESS or a cluster file in Ray's shared temp directory names), on loopback, in its own 0700 temp
    directory, with Ray's token authentication (a fresh random token) where the installed Ray has it. Any other
    address attaches to that cluster, which is then trusted like this machine."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, limits: Limits | None = None,
                 allowed_roots: list[str] | None = None):
        import ray

        self.limits = limits or Limits()
        self.allowed_roots = list(allowed_roots or [])
        self.ray = ray
        self.temp_dir: str | None = None
        self.private = address in (None, "", "local")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True}
            if self.private:
                kwargs.update(self._private_instance(num_cpus))
            else:
                kwargs["address"] = address
            ray.init(**kwargs)
        self.task = ray.remote(max_retries=0)(_remote_job)

    def _private_instance(self, num_cpus: int | None) -> dict[str, Any]:
        self.temp_dir = tempfile.mkdtemp(prefix="gp-ray-")  # 0700: sockets, logs and session files are ours alone
        os.environ.pop("RAY_ADDRESS", None)  # nothing started from here attaches elsewhere
        if token_auth_available():
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
            os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
            from ray._raylet import Config  # type: ignore[attr-defined]

            Config.initialize("")  # Ray caches its config at import: let this process see token mode too
        return {"address": "local", "_temp_dir": self.temp_dir, "_node_ip_address": "127.0.0.1", "num_cpus": num_cpus}

    async def run(self, job: Job, *, python: str | None, timeout_s: float, progress: ProgressFn | None = None,
                  limits: Limits | None = None, allowed_roots: list[str] | None = None) -> ChildOutcome:
        limits = limits or self.limits
        roots = self.allowed_roots if allowed_roots is None else allowed_roots
        device = job.target.get("device") or "cpu"
        gpus = 1 if device.startswith("cuda") else 0
        if progress is not None:
            await progress(Phase.STARTING, None)
        ref = self.task.options(num_gpus=gpus).remote(job, python, timeout_s, dataclasses.asdict(limits), roots)
        try:
            data = await ref
        except asyncio.CancelledError:
            # kill the worker running the task; the child dies with it (PR_SET_PDEATHSIG in child.py)
            self.ray.cancel(ref, force=True)
            raise
        except self.ray.exceptions.RayError as exc:
            kind = type(exc).__name__
            return ChildOutcome(report=None, tool_error=None, phase=Phase.REMOTE, returncode=None, timed_out=False, stdout="",
                                stderr=f"{kind}: {str(exc)[-2000:]}", seconds=0.0, mode="ray",
                                note=f"the Ray worker running this check failed ({kind})")
        try:
            return parse_outcome(data)
        except ValueError as exc:
            return ChildOutcome(report=None, tool_error=None, phase=Phase.REMOTE, returncode=None, timed_out=False, stdout="",
                                stderr=str(exc)[:2000], seconds=0.0, mode="ray",
                                note="the Ray worker running this check sent back no valid result")

    async def start(self) -> None:
        return None

    def stop(self) -> None:
        self.shutdown()

    @property
    def warm_alive(self) -> bool:
        return False

    def shutdown(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
