"""Entry point of the sandboxed child: read a job, load the target, run one check, write JSON.

Run as `python -I .../gradprobe/sandbox/child.py` by launch.py (already confined:
see confine.py), or called in a warm worker's confined fork; gradprobe reaches the
child by path, so any interpreter with a compatible torch works. The job arrives on
stdin; progress events and the result leave as JSON lines on a dedicated pipe
(fd given in GRADPROBE_RESULT_FD), never on stdout, which belongs to the user's
prints. Every failure becomes a finding; nothing here trusts the user's code.
"""

from __future__ import annotations


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


def run(job: dict, fd: int) -> None:
    """Run one job and exit; shared by the cold child and the warm worker's forked children."""
    os.environ.pop("GRADPROBE_RESULT_FD", None)
    chan = Channel(fd)
    import faulthandler

    faulthandler.enable()
    chan.progress("starting")
    from gradprobe.sandbox.job import run_job, runtime_facts

    report = run_job(job, chan.progress)  # the isolation facts are the server's to report (runner.py), not ours
    if isinstance(report.get("facts"), dict):
        report["facts"]["runtime"] = runtime_facts()
    sys.stdout.flush()  # before the result: the server may stop reading once the result is in
    sys.stderr.flush()
    chan.send({"type": "result", "report": report})
    chan.out.close()
    os._exit(0)  # skip the user's atexit handlers and non-daemon threads


def main() -> None:
    _bootstrap_path()
    fd = int(os.environ.get("GRADPROBE_RESULT_FD", "3"))
    job = json.loads(sys.stdin.read() or "{}")
    run(job, fd)


if __name__ == "__main__":
    main()
