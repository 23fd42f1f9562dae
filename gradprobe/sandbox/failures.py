"""The codes the sandbox and the loaders decide, as Rule units (GP113 resource-limit is in gradprobe/outcomes.py).

    GP000 internal-error        a check of gradprobe raised (our bug, never the user's)
    GP100 target-load-failed    the user's code raised while the target was imported or built
    GP106 missing-super-init    ... and it was a module class that never called super().__init__()
    GP112 no-training-step      a script ended, failed or ran out of time before its first training step
    GP114 target-timeout        the call's wall-clock limit ran out; the child's process tree was killed
    GP115 child-died            the child crashed, was killed or exited without sending a result
    GP116 remote-worker-failed  the remote executor (a Ray worker) failed before the child could answer
    GP117 interpreter-failed    the interpreter the target names could not be started (or ended before our child)

Torch-free: the parent (GP112 blocked, GP114-GP117) and the child (GP000, GP100, GP106, GP112) both emit these.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gradprobe.findings import Finding, Location, Rule, Situation
from gradprobe.outcomes import resource_limit_finding, target_failed_finding
from gradprobe.report import make_report
from gradprobe.sandbox.protocol import Phase

GP000: Rule[Any] = Rule(
    code="GP000", name="internal-error", severity="error", rank=0,
    summary="gradprobe itself failed on this target (a bug or an unsupported construct).",
    why="The check could not finish; nothing is claimed about the user's code. The evidence holds gradprobe's traceback.",
    example="a check raising on an unusual model structure",
    message="gradprobe's {tool} check failed on this target: {error}",
    fix="This is a gradprobe bug or an unsupported construct; the evidence has the traceback (please report it).",
    situations={
        "script_step": Situation(
            when="gradprobe failed on the step it captured from a script (the script's own step ran)",
            message="gradprobe failed on the captured step: {error}",
            fix="This is a gradprobe limitation on this script (the script's own step ran); the evidence has the details."),
        "replay": Situation(
            when="gradprobe's replay of a script's captured step failed where the script's own step did not",
            message="gradprobe's replay of the captured step failed where the script's own step did not: {message}",
            fix="This is a gradprobe limitation on this script (the script's own step ran); the evidence has the details."),
    },
)

GP106: Rule[Any] = Rule(
    code="GP106", name="missing-super-init", severity="error", rank=2,
    summary="A module class never called super().__init__().",
    why="nn.Module.__init__ creates the registries for parameters and submodules; without it assigning a submodule or "
        "parameter fails.",
    example="class Net(nn.Module):\n    def __init__(self):\n        self.fc = nn.Linear(2, 2)",
    message="{cls}.__init__ never called super().__init__(), so assigning a submodule or parameter failed: {error}",
    fix="Call super().__init__() first in __init__.",
    situations={
        "named": Situation(
            when="the class whose __init__ failed is known",
            fix="class Net(nn.Module):\n    def __init__(self):\n        super().__init__()  # first line\n        ..."),
        "unnamed": Situation(
            when="the failing class could not be told from the traceback",
            message="A module class.__init__ never called super().__init__(), so assigning a submodule or parameter "
                    "failed: {error}",
            fix="class Net(nn.Module):\n    def __init__(self):\n        super().__init__()  # first line\n        ..."),
    },
)

GP112: Rule[Any] = Rule(
    code="GP112", name="no-training-step", severity="error", rank=3,
    summary="A script target ran until its timeout (or ended) without reaching a backward/optimizer step.",
    why="Nothing about gradients can be measured before the first backward; the finding says how far the script got "
        "(last user line, phase).",
    example="a training script stuck in data loading, or one that exits before its loop",
    message="{name} reached no training step (furthest: {phase}).",
    fix="Make the script reach its first training step quickly (a small dataset, fewer setup steps), or raise "
        "target.timeout_s.",
    situations={
        "timeout": Situation(
            when="gradprobe's timer stopped the script (its share of the timeout ran out)",
            message="{name} ran for {seconds:.0f}s (gradprobe's share of the timeout) without reaching a training step; "
                    "it was{where} when stopped (furthest: {phase}).",
            fix="Give the call a larger timeout_s, or arguments that reach the first step sooner (fewer eval/warm-up "
                "iterations, a smaller dataset)."),
        "exited": Situation(
            when="the script called sys.exit() first",
            message="{name} called sys.exit({exit_code!r}) before any training step (furthest: {phase}).",
            fix="Pass the arguments the script needs to start training (see its usage message in the output)."),
        "raised": Situation(
            when="the script raised first",
            message="{name} failed before any training step while {phase}: {exception}: {error}",
            fix="Fix the error in the traceback (evidence.traceback); the script must reach loss.backward() and "
                "optimizer.step()."),
        "read_only_project": Situation(
            when="the script wrote into a file or folder the project already has, which gradprobe shows it read-only "
                 "(plainly the write succeeds: gradprobe's limit, not the script's error)",
            message="{name} could not write `{path}` before its first training step: under gradprobe the project's "
                    "existing files and folders are read-only (the script's new files and folders go to a scratch "
                    "copy of its working directory, gone after the call). Run plainly, this write succeeds; the "
                    "checks did not run.",
            fix="Point the script's outputs at a folder the project does not have yet, or outside it (e.g. an output "
                "directory under /tmp), or move the existing `{top}` aside, and call again."),
        "forward_error": Situation(
            when="the model's forward raised and the script caught that error and went on",
            message="{name} {ended} without a training step: its forward raised {exception}: {error}, "
                    "and the script caught that error and went on.",
            fix="Fix the error of the forward (evidence.traceback); do not catch and ignore exceptions around the "
                "training loop."),
        "finished": Situation(
            when="the script finished without calling backward() or optimizer.step()",
            message="{name} finished without calling backward() or optimizer.step() (furthest: {phase}); "
                    "an exception caught around the training loop, or arguments that skip training, end it early.",
            fix="Run it with arguments that train at least one step; do not catch and ignore exceptions around the loop."),
        "blocked": Situation(
            when="the script was blocked where gradprobe's timer could not stop it; the parent killed it at the timeout",
            message="The script reached no training step within {timeout:g} s: it was blocked where gradprobe's timer "
                    "could not stop it (a call in C, e.g. a rendezvous or a network wait); its process tree was killed.",
            fix="Look for a wait that never returns before the first step (a rendezvous for more ranks, a download), "
                "or raise target.timeout_s."),
    },
)

GP114: Rule[Any] = Rule(
    code="GP114", name="target-timeout", severity="error", rank=1,
    summary="The call ran past its wall-clock limit (target.timeout_s); the child's process tree was killed.",
    why="Nothing more can be measured once the time is up; the finding names the phase the child was in (importing, "
        "building, checking) and the evidence holds its output, so the slow or endless part can be found.",
    example="an endless loop in build_model(), a forward that takes minutes on CPU, a download at import time",
    message="The target did not finish within {timeout:g} s (it was in phase '{phase}'); its process tree was killed.",
    fix="Look for an endless loop or a very slow step in that phase, or raise target.timeout_s.",
)

GP115: Rule[Any] = Rule(
    code="GP115", name="child-died", severity="error", rank=1,
    summary="The child process crashed, was killed or exited without sending a result.",
    why="The child ends with a result or a finding unless something stops the process itself: a segfault in an "
        "extension, os._exit() in the user's code, a signal. The finding says how it ended and in which phase; the "
        "evidence holds its stderr.",
    example="an extension that segfaults while building, os._exit(0) in build_model()",
    message="The child process {exit} in phase '{phase}' without a result.",
    fix="See evidence.stderr_tail for the crash (a segfault in an extension, os._exit, an out-of-memory kill).",
)

GP116: Rule[Any] = Rule(
    code="GP116", name="remote-worker-failed", severity="error", rank=1,
    summary="The remote executor (a Ray worker) failed before the child could answer.",
    why="Neither the code nor gradprobe is at fault: the machine that ran the call went away or its task failed. "
        "Nothing is claimed about the code.",
    example="a Ray worker lost while the call ran",
    message="{note}: {detail}",
    fix="Check the Ray cluster (the worker's logs); the call can be retried.",
)

GP117: Rule[Any] = Rule(
    code="GP117", name="interpreter-failed", severity="error", rank=1,
    summary="The interpreter the target names (target.python) could not be started inside the sandbox.",
    why="The checks run in the interpreter the target names; when it cannot be executed (a missing loader, a file "
        "that is not executable inside the sandbox's view) nothing can run.",
    example='target.python = "/home/ana/proj/.venv/bin/python" whose base interpreter lives outside the view',
    message="The interpreter {python} could not be started: {error}.",
    fix="Name an interpreter that runs (try it with `PYTHON -c 'import torch'`), or leave target.python out to use the "
        "server's.",
    situations={
        "ended_first": Situation(
            when="the interpreter was executed but ended before gradprobe's child started (not a Python that can run "
                 "gradprobe, or it failed at start)",
            message="The interpreter {python} ({reason}) {exit} before gradprobe's child started: it is not a Python that "
                    "can run gradprobe (Python >= 3.10 with torch >= 2.1), or it failed at start. No user code ran.",
            fix="See evidence.stderr_tail for what it printed; name the right one with the target's `python` (an absolute "
                'path, e.g. "/home/ana/proj/.venv/bin/python"; `--python` on the command line), or `"python": "server"` '
                "for the server's own."),
    },
)


def load_failure_report(tool: str, exc: Any, user: Any) -> dict[str, Any]:
    """GP100 (or GP106 for a missing super().__init__(), GP113 for an allocation a memory limit refused) with the
    user's trimmed traceback. `exc` is a TargetError, `user` the project's UserCode."""
    cause = exc.cause or exc
    tb = user.trimmed_traceback(cause) if exc.cause is not None else ""
    loc = user.innermost_of_traceback(cause) if exc.cause is not None else None
    text = str(cause)
    evidence = {"phase": exc.phase, "exception": type(cause).__name__, "traceback": tb}
    finding: Finding
    from gradprobe.checks.core.torchcompat import MISSING_SUPER_INIT, allocation_failure  # the child has torch

    limit = allocation_failure(exc.cause)
    if limit is not None:
        finding = resource_limit_finding(exc.phase, limit, location=loc, evidence={"traceback": tb})
        return make_report(tool, [finding], [f"The target could not be loaded: a memory limit stopped it ({exc.phase})."])
    if MISSING_SUPER_INIT.search(text):
        cls = _class_of_failing_init(cause)
        finding = GP106.finding("named" if cls else "unnamed", parameters=[cls] if cls else [], location=loc,
                                evidence=evidence, cls=cls, error=text)
    else:
        finding = target_failed_finding(exc.phase, exc, location=loc, evidence=evidence)
    return make_report(tool, [finding], [f"The target could not be loaded ({exc.phase})."])


def _class_of_failing_init(exc: BaseException) -> str | None:
    tb = exc.__traceback__
    name = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            if "torch/nn/modules/module.py" not in frame.f_code.co_filename:
                name = type(frame.f_locals["self"]).__name__
        tb = tb.tb_next
    return name


def internal_error_report(tool: str, exc: BaseException) -> dict[str, Any]:
    """GP000: a check of gradprobe raised. Never blamed on the user; the evidence holds our traceback.
    An allocation a memory limit refused inside a check is GP113: a resource limit, not a gradprobe bug."""
    from gradprobe.checks.core.torchcompat import allocation_failure  # the child has torch

    limit = allocation_failure(exc)
    if limit is not None:
        finding = resource_limit_finding(f"running gradprobe's {tool} check", limit)
        return make_report(tool, [finding], ["A memory limit stopped the check (not a finding about the code)."])
    finding = GP000.finding(
        tool=tool, error=f"{type(exc).__name__}: {exc}",
        evidence={"phase": "checking", "traceback": "".join(traceback.format_exception(exc))[-4000:]},
    )
    return make_report(tool, [finding], ["gradprobe failed while checking this target (an internal error, not a finding "
                                         "about the code)."])


def script_internal_error(error: str, evidence: Mapping[str, Any]) -> Finding:
    """GP000 for a failure of gradprobe on a script's captured step (the script's own step ran)."""
    return GP000.finding("script_step", error=error, evidence=evidence)


def replay_failed(finding: Finding) -> Finding:
    """GP000 in place of a failure of gradprobe's replay of a script's step that the script's own step did not have."""
    return GP000.finding("replay", message=finding["message"], evidence={"replay_finding": finding})


def script_no_step(situation: str, *, location: Location | Mapping[str, Any] | None, evidence: Mapping[str, Any],
                    **fields: Any) -> Finding:
    """GP112 for a script that reached no training step; `situation` is how it ended (see GP112's situations)."""
    return GP112.finding(situation, location=location, evidence=evidence, **fields)


@dataclass(frozen=True)
class ChildFate:
    """What the parent measured of a call that ended without the child's report (the facts GP112 blocked and
    GP114-GP117 are told apart by)."""

    phase: str  # the last phase the child announced
    timed_out: bool
    returncode: int | None
    timeout_s: float
    script: bool  # a script or module target
    evidence: Mapping[str, Any]
    remote_note: str | None = None  # the remote executor's word on a task that failed
    start_error: str | None = None  # launch.py's word: the target's interpreter could not be executed
    python: str | None = None  # the interpreter the target runs (None: the server's own)
    python_reason: str = ""  # why that interpreter was chosen

    @property
    def cause(self) -> Literal["interpreter", "ended_first", "blocked", "timeout", "remote", "died"]:
        if self.start_error is not None:
            return "interpreter"
        if not self.timed_out and self.remote_note is None and self.python and self.phase == Phase.STARTING:
            return "ended_first"  # no user code ran: the target's interpreter could not start gradprobe's child
        if self.timed_out:
            return "blocked" if self.script and self.phase == Phase.RUNNING_SCRIPT else "timeout"
        return "remote" if self.remote_note is not None else "died"


def child_failure_finding(fate: ChildFate, stderr: str) -> Finding:
    """The finding for a call that ended without the child's report: the parent's codes, by `fate.cause`."""
    cause, ev = fate.cause, fate.evidence
    if cause == "interpreter":
        return GP117.finding(python=fate.python or "(server interpreter)", error=fate.start_error, evidence=ev)
    if cause == "ended_first":
        return GP117.finding("ended_first", python=fate.python, reason=fate.python_reason,
                             exit=describe_exit(fate.returncode), evidence=ev)
    if cause == "blocked":  # the script's own timer could not interrupt it (a blocking C call, e.g. a network wait)
        return GP112.finding("blocked", timeout=fate.timeout_s, evidence=ev)
    if cause == "timeout":
        return GP114.finding(timeout=fate.timeout_s, phase=fate.phase, evidence=ev)
    if cause == "remote":
        return GP116.finding(note=fate.remote_note, detail=stderr.splitlines()[0] if stderr else "", evidence=ev)
    return GP115.finding(exit=describe_exit(fate.returncode), phase=fate.phase, evidence=ev)


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "did not exit"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"
