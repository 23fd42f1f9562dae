"""Entry point of the sandboxed child: read a job, load the target, run one check, write JSON.

Run as `python -I .../gradprobe/sandbox/child.py` by launch.py (already confined:
see confine.py), or called in a warm worker's confined fork; gradprobe reaches the
child by path, so any interpreter with a compatible torch works (the standard library and
torch are all the child imports). The
job arrives on stdin; progress events and the result leave as protocol messages
(protocol.py), one JSON line each, on a dedicated pipe (fd given in
GRADPROBE_RESULT_FD), never on stdout, which belongs to the user's prints. Every
failure becomes a finding; nothing here trusts the user's code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradprobe.sandbox.protocol import Job, Phase, Result


def _bootstrap_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)  # never import our own modules as top-level names
    if root not in sys.path:
        sys.path.insert(0, root)


class Channel:
    """Protocol messages to the parent over the result pipe."""

    def __init__(self, fd: int):
        self.out = os.fdopen(fd, "w", buffering=1, encoding="utf-8", closefd=True)
        self.t0 = time.monotonic()

    def progress(self, phase: Phase | str) -> None:
        from gradprobe.sandbox.protocol import Phase, Progress

        self.out.write(Progress(phase=Phase(phase), elapsed_s=round(time.monotonic() - self.t0, 3)).model_dump_json() + "\n")
        self.out.flush()

    def finish(self, result: Result) -> None:
        """Send the result and exit: skip the user's atexit handlers and non-daemon threads."""
        sys.stdout.flush()  # before the result: the server may stop reading once the result is in
        sys.stderr.flush()
        self.out.write(result.model_dump_json() + "\n")
        self.out.close()
        os._exit(0)


def apply_target_env(env: Any) -> None:
    """The target's own `env`, set here, inside every layer (never on a process that runs before confinement: the
    launcher and the named interpreter start with the server's allow-list only); names the server refuses are
    skipped here too."""
    from gradprobe.envrules import refused

    if not isinstance(env, dict):
        return
    for name, value in env.items():
        if isinstance(name, str) and isinstance(value, str) and name.isidentifier() and "\0" not in value \
                and refused(name) is None:
            os.environ[name] = value


def run(job: Job, fd: int) -> None:
    """Run one job and exit; shared by the cold child and the warm worker's forked children."""
    os.environ.pop("GRADPROBE_RESULT_FD", None)
    apply_target_env(job.target.get("env"))
    chan = Channel(fd)
    import faulthandler

    from gradprobe.sandbox.protocol import Phase, Result
    from gradprobe.sandbox.run_check import run_job, runtime_facts

    faulthandler.enable()
    chan.progress(Phase.STARTING)
    # the isolation facts are the server's to report (runner.py), not ours
    report = run_job(job, chan.progress)
    if isinstance(report, dict) and isinstance(report.get("facts"), dict):
        report["facts"]["runtime"] = runtime_facts()
    chan.finish(Result(report=report))


def _no_protocol(fd: int, exc: ImportError) -> None:
    """The one message written without the models (an import the protocol needs may be what the interpreter lacks)."""
    from gradprobe.sandbox.interpreter import interpreter_error, unusable_interpreter

    error = unusable_interpreter() or interpreter_error(exc)
    line: dict[str, Any] = {"type": "result", "report": {"tool_error": error, "tool_error_kind": "interpreter"}}
    os.write(fd, (json.dumps(line) + "\n").encode())
    os._exit(0)


def main() -> None:
    _bootstrap_path()
    fd = int(os.environ.get("GRADPROBE_RESULT_FD", "3"))
    try:
        from gradprobe.sandbox.protocol import Job
    except ImportError as exc:
        _no_protocol(fd, exc)
        return
    run(Job.model_validate_json(sys.stdin.read() or '{"tool": ""}'), fd)


if __name__ == "__main__":
    main()
