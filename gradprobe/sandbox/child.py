"""Entry point of the sandboxed child: read a job, load the target, run one check, write JSON.

Run as `python -I .../gradprobe/sandbox/child.py`: gradprobe reaches the child
by path, so any interpreter with a compatible torch works. The job arrives on
stdin; progress events and the result leave as JSON lines on a dedicated pipe
(fd given in GRADPROBE_RESULT_FD), never on stdout, which belongs to the user's
prints. Every failure becomes a finding; nothing here trusts the user's code.
"""

from __future__ import annotations

from typing import Any

import json
import os
import sys
import time


def _bootstrap_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)  # never import our own modules as top-level names
    if root not in sys.path:
        sys.path.insert(0, root)


def _apply_limits(limits: dict) -> None:
    import resource

    def cap(which, value):
        if value is None:
            return
        try:
            _, hard = resource.getrlimit(which)
            value = int(value)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            pass

    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_AS, limits.get("memory_bytes"))
    cap(resource.RLIMIT_CPU, limits.get("cpu_seconds"))
    cap(resource.RLIMIT_FSIZE, limits.get("file_bytes"))
    cap(resource.RLIMIT_NOFILE, limits.get("open_files"))


class Channel:
    """JSON lines to the parent over the result pipe."""

    def __init__(self, fd: int):
        self.out = os.fdopen(fd, "w", buffering=1, encoding="utf-8", closefd=True)
        self.t0 = time.monotonic()
        self.phase = "starting"

    def send(self, obj: dict) -> None:
        self.out.write(json.dumps(obj, default=str, allow_nan=False) + "\n")
        self.out.flush()

    def progress(self, phase: str) -> None:
        self.phase = phase
        self.send({"type": "progress", "phase": phase, "elapsed_s": round(time.monotonic() - self.t0, 3)})


def _die_with_parent() -> None:
    """If whatever started us dies (a killed Ray worker, a crashed server), so do we."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def run(job: dict, fd: int) -> None:
    """Run one job and exit; shared by the cold child and the warm worker's forked children."""
    _die_with_parent()
    os.environ.pop("GRADPROBE_RESULT_FD", None)
    chan = Channel(fd)
    _apply_limits(job.get("limits") or {})
    import faulthandler

    faulthandler.enable()
    chan.progress("starting")
    policy = job.get("isolation") or {}
    from gradprobe.sandbox.isolation import Layer, apply

    layers = {"cgroup": Layer(bool(policy.get("cgroup_enforced")), policy.get("cgroup_state", "off"))}
    if policy.get("enabled"):
        layers.update(apply(policy))
    isolation = {k: layer.text for k, layer in layers.items()}
    missing = [k for k, layer in layers.items() if not layer.enforced]
    from gradprobe.sandbox.job import run_job

    report: dict[str, Any]
    if policy.get("require") and missing:
        report = {"tool_error": f"isolation required but missing here: {', '.join(missing)} ({isolation})"}
    else:
        report = run_job(job, chan.progress)
        if "tool_error" not in report:
            report.setdefault("facts", {})["isolation"] = isolation
    chan.send({"type": "result", "report": report})
    chan.out.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the user's atexit handlers and non-daemon threads


def main() -> None:
    _bootstrap_path()
    fd = int(os.environ.get("GRADPROBE_RESULT_FD", "3"))
    job = json.loads(sys.stdin.read() or "{}")
    run(job, fd)


if __name__ == "__main__":
    main()
