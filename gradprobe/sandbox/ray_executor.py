"""Run sandboxed jobs on a Ray cluster: one Ray task per call, the same sandboxed child inside it.

For teams whose models need more GPUs than one box has. Each task runs
`run_child` on whichever worker Ray picks (asking for a GPU when the target's
device wants CUDA), so isolation, limits and timeouts are the same as locally,
and it returns the same JSON. The target's project_dir must be visible at the
same path on the workers (a shared file system). Cancelling the MCP call cancels
the Ray task; a worker that dies becomes a GP116 finding saying so.
"""

from __future__ import annotations

from typing import Any

import asyncio
import dataclasses

from gradprobe.sandbox.protocol import Job, Phase
from gradprobe.sandbox.runner import ChildOutcome, Limits


def _remote_job(job: Job, python: str | None, timeout_s: float, limits: dict, allowed_roots: list[str]) -> dict:
    from gradprobe.sandbox.runner import Limits as L
    from gradprobe.sandbox.runner import run_child

    outcome = asyncio.run(run_child(job, python=python, timeout_s=timeout_s, limits=L(**limits), allowed_roots=allowed_roots))
    return dataclasses.asdict(outcome)


class RayExecutor:
    """The `Executor` protocol (executor.py) on a Ray cluster."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, limits: Limits | None = None,
                 allowed_roots: list[str] | None = None):
        import ray

        self.limits = limits or Limits()
        self.allowed_roots = list(allowed_roots or [])
        self.ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True}
            if address in (None, "", "local"):
                kwargs["num_cpus"] = num_cpus
            else:
                kwargs["address"] = address
            ray.init(**kwargs)
        self.task = ray.remote(max_retries=0)(_remote_job)

    async def run(self, job: Job, *, python: str | None, timeout_s: float, progress=None, limits: Limits | None = None) -> ChildOutcome:
        limits = limits or self.limits
        device = job.target.get("device") or "cpu"
        gpus = 1 if device.startswith("cuda") else 0
        if progress is not None:
            await progress(Phase.STARTING, None)
        ref = self.task.options(num_gpus=gpus).remote(job, python, timeout_s, dataclasses.asdict(limits), self.allowed_roots)
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
        data["mode"] = "ray"
        return ChildOutcome(**data)

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
