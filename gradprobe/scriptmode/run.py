"""Run a training script (or `python -m` module) in the child until its first step, then check that step.

The script runs as `__main__` with `sys.argv` set, its own directory first on `sys.path`, and
a working directory that mirrors the project (a link to each top-level entry) inside the call's
scratch: relative reads reach the project's files, new files (checkpoints, logs) land in scratch.
A timer stops a script that does not reach a step before its share of the timeout; a script
that ends, exits or fails first gets GP112 with how far it got.
"""

from __future__ import annotations

import errno
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

from gradprobe.findings import Finding, Location
from gradprobe.outcomes import GP113
from gradprobe.report import make_report
from gradprobe.sandbox.failures import GP000, script_no_step
from gradprobe.sandbox.protocol import Phase
from gradprobe.scriptmode.observe import StepWatch, StopScript
from gradprobe.scriptmode.modelranks import ModelStep
from gradprobe.scriptmode.step import Replay

# the script gets this share of the call's timeout; the rest is for the checks on its step
SCRIPT_SHARE = 0.7


def scratch_dir() -> str:
    """Where a script's new files land: the sandbox's scratch (TMPDIR), else a fresh temporary directory (a script run
    in-process, through the library: never the caller's working directory, which may be a checkout)."""
    return os.environ.get("TMPDIR") or tempfile.mkdtemp(prefix="gradprobe-run-")


def _mirror_cwd(project_dir: str, scratch: str) -> str:
    """A directory in scratch that shows the project's top-level entries (links) and takes new files."""
    run_dir = os.path.join(scratch, "run")
    os.makedirs(run_dir, exist_ok=True)
    try:
        entries = os.listdir(project_dir)
    except OSError:
        entries = []
    for name in entries:
        link = os.path.join(run_dir, name)
        if not os.path.lexists(link):
            try:
                os.symlink(os.path.join(project_dir, name), link)
            except OSError:
                pass
    return run_dir


class ScriptRun:
    """The outcome of running the script: how it ended and what the watch saw."""

    def __init__(self, watch: StepWatch):
        self.watch = watch
        self.ended = "finished"  # finished | stopped | exited | raised | timeout
        self.exc: BaseException | None = None
        self.stop_frame_loc: dict | None = None
        self.exit_code: Any = None
        self.seconds = 0.0
        self.t0 = time.monotonic()
        self.replayed: Replay | None = None  # the step the checks replayed (scriptmode/step.py), once built
        self.cwd = ""  # the working directory the script ran in (the project's mirror in scratch)

    def restore(self) -> None:
        """Stop the timer and the observers (the checks run next)."""
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        self.watch.uninstall()
        self.seconds = self.seconds or time.monotonic() - self.t0

    def rearm(self) -> None:
        """Observers back and a 1 s repeating timer, to stop the script again if it goes on."""
        self.watch.install()
        signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)


def exec_script(project_dir: str, script: str | None, module: str, args: list[str]) -> None:
    """The script (or `python -m` module) as `__main__`, with its argv and sys.path as python would set them."""
    if script:
        path = os.path.join(project_dir, script)
        sys.argv = [path, *args]
        sys.path.insert(0, os.path.dirname(path))  # as `python path` sets it: the script's directory, not the cwd
        runpy.run_path(path, run_name="__main__")
    else:
        sys.argv = [module, *args]
        sys.path.insert(0, project_dir)  # as `python -m` sets it: the working directory (the project) first
        runpy.run_module(module, run_name="__main__", alter_sys=True)


def run_script(target: dict, watch: StepWatch, progress: Callable[[str], None],
               started: Callable[[ScriptRun], None] = lambda run: None) -> ScriptRun:
    project_dir = os.path.realpath(target["project_dir"])
    script: str | None = target.get("script")
    module = str(target.get("module") or "")
    args = [str(a) for a in (target.get("args") or [])]
    scratch = scratch_dir()
    run = ScriptRun(watch)
    started(run)
    child_t0 = getattr(getattr(progress, "__self__", None), "t0", None)  # the child's start (its result channel)
    elapsed = time.monotonic() - child_t0 if isinstance(child_t0, float) else 0.0
    budget = float(target.get("timeout_s") or 120.0) * SCRIPT_SHARE - elapsed
    t0 = time.monotonic()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if watch.capture is None and not watch.stopping:
            run.ended = "timeout"
            run.stop_frame_loc = watch.user.innermost(frame)
            run.seconds = time.monotonic() - t0
            watch.stopping = True
            raise StopScript("gradprobe's time for the script ran out")
        watch.stop_swallowed()

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(budget, 1.0), 1.0)  # repeats: a swallowed stop comes back
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    run.cwd = _mirror_cwd(project_dir, scratch)
    os.chdir(run.cwd)
    run.t0 = t0
    watch.install()
    progress(Phase.RUNNING_SCRIPT)
    try:
        # a worker the script spawned (its function, scriptmode/ranks.py) or a rank of a build_model() target
        # (scriptmode/modelranks.py): not a file
        entry = target.get("_entry")
        if isinstance(entry, ModelStep):
            entry.step_watch = watch  # it loads the target with the watch passive: a step there is the target's build
        if callable(entry):
            sys.argv = [os.path.join(project_dir, script) if script else module or str(target.get("model") or ""), *args]
            entry()
        else:
            exec_script(project_dir, script, module, args)
    except StopScript as exc:
        run.exc = exc
        if watch.capture is not None:
            run.ended = "stopped"
    except SystemExit as exc:
        run.ended, run.exc, run.exit_code = "exited", exc, exc.code
    except BaseException as exc:  # the script's own error (or a KeyboardInterrupt it raised)
        run.ended, run.exc = "raised", exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, old_handler)
        watch.uninstall()
        run.seconds = run.seconds or time.monotonic() - t0
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
    if watch.capture is not None and run.ended != "timeout":
        run.ended = "stopped"
    elif watch.capture is None and watch.backwards and run.ended in ("finished", "exited", "timeout", "raised"):
        # backward ran but no optimizer stepped (the script ended, failed or ran out of time first):
        # the last backward is the step, with the optimizer made last
        last = watch.backwards[-1]
        opt = watch.optimizers[-1] if watch.optimizers else None
        watch.take(opt, last.location, closure=False, how="backward", in_script=False)
    return run


def no_step_finding(run: ScriptRun, target: dict[str, Any]) -> Finding:
    """GP112: the script never reached a training step; say how it ended and how far it got (GP113 when a memory
    limit stopped it: a resource limit, not the script's error)."""
    from gradprobe.checks.core.torchcompat import allocation_failure
    from gradprobe.outcomes import resource_limit_finding

    watch = run.watch
    name = target.get("script") or (f"-m {target.get('module')}" if target.get("module") else
                                     f"The build_model() form of {target.get('model') or 'the setup code'}")
    phase = watch.phase_name()
    evidence: dict[str, Any] = {"ended": run.ended, "furthest_phase": phase, "script_seconds": round(run.seconds, 2),
                                "modules_called_with_grad": len(watch.calls), "backward_calls": len(watch.backwards)}
    stopped_by = run.exc if run.ended == "raised" else watch.forward_error[0] if watch.forward_error is not None else None
    limit = allocation_failure(stopped_by) if isinstance(stopped_by, BaseException) else None
    if limit is not None and stopped_by is not None:
        return resource_limit_finding(
            f"running {name} before its first training step ({phase})", limit,
            location=watch.user.innermost_of_traceback(stopped_by),
            evidence={**evidence, "traceback": watch.user.trimmed_traceback(stopped_by)})
    project = str(target.get("project_dir") or "")
    situation, loc, fields = _how_it_ended(run, evidence, os.path.realpath(project) if project else "")
    return script_no_step(situation, location=cast(Location | None, loc), evidence=evidence, name=name, phase=phase,
                          **fields)


def _project_path_written(exc: BaseException, cwd: str, project_dir: str) -> str | None:
    """The project-relative path of a write the read-only view refused (EROFS on a file the project has, reached
    through the working directory's mirror), or None for any other error."""
    if not (isinstance(exc, OSError) and exc.errno == errno.EROFS and isinstance(exc.filename, str) and cwd
            and project_dir):
        return None
    real = os.path.realpath(os.path.join(cwd, exc.filename))
    if real != project_dir and not real.startswith(project_dir + os.sep):
        return None
    return os.path.relpath(real, project_dir)


def _how_it_ended(run: ScriptRun, evidence: dict[str, Any],
                  project_dir: str) -> tuple[str, dict[str, Any] | None, dict[str, Any]]:
    """GP112's situation, the location and the template fields for how the script ended (adds to `evidence`)."""
    watch = run.watch
    if run.ended == "timeout":
        loc = run.stop_frame_loc
        where = f" at line {loc['line']} of {os.path.basename(loc['file'])}" if loc else ""
        return "timeout", loc, {"seconds": run.seconds, "where": where}
    if run.ended == "exited":
        loc = watch.user.innermost_of_traceback(run.exc) if run.exc is not None else None
        return "exited", cast("dict[str, Any] | None", loc), {"exit_code": run.exit_code}
    if run.ended == "raised" and run.exc is not None:
        evidence.update(exception=type(run.exc).__name__, traceback=watch.user.trimmed_traceback(run.exc))
        loc = watch.user.innermost_of_traceback(run.exc)
        written = _project_path_written(run.exc, run.cwd, project_dir)
        if written is not None:  # the project's view is read-only: gradprobe's limit, never the script's error
            evidence.update(read_only_project=True, path=written)
            return "read_only_project", cast("dict[str, Any] | None", loc), {"path": written,
                                                                               "top": written.split(os.sep)[0]}
        return "raised", cast("dict[str, Any] | None", loc), {"exception": type(run.exc).__name__, "error": run.exc}
    if watch.forward_error is not None:
        exc, floc = watch.forward_error
        evidence.update(exception=type(exc).__name__, traceback=watch.user.trimmed_traceback(exc))
        return "forward_error", floc, {"ended": run.ended, "exception": type(exc).__name__, "error": exc}
    return "finished", run.stop_frame_loc, {}


def no_step_report(tool: str, run: ScriptRun, target: dict[str, Any]) -> dict[str, Any]:
    from gradprobe.userframes import raised_in_gradprobe

    f = no_step_finding(run, target)
    if f["code"] != GP113.code and run.ended == "raised" and raised_in_gradprobe(run.exc):
        # the script raised inside gradprobe's own code (a watch of ours): gradprobe's failure, never the script's
        f = GP000.finding(tool=tool, error=f"{type(run.exc).__name__}: {run.exc}"[:500] + " (raised inside gradprobe's "
                          "watch of the script, before its first step)", evidence={
                              **f["evidence"], "raised_in": "gradprobe's watch of the script",
                              "internal_traceback": "".join(traceback.format_exception(run.exc))[-4000:] if run.exc else ""})
    why = "a memory limit stopped it" if f["code"] == GP113.code else run.ended
    return make_report(tool, [f], [f"The script reached no training step ({why})."])
