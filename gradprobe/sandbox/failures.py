"""The codes the sandbox and the loader decide (GP000, GP100, GP106, GP112; GP113 is in gradprobe/outcomes.py), beside the functions that emit them.

Torch-free: the parent (timeouts, crashes, a cgroup OOM kill) and the child (load failures, a
gradprobe bug inside a check, an allocation a memory limit refused) both build these reports.
"""

from __future__ import annotations

import traceback
from typing import Any

from gradprobe.findings import Finding, make_finding
from gradprobe.outcomes import resource_limit_finding, target_failed_finding
from gradprobe.report import make_report

RULES = {
    "GP000": {
        "name": "internal-error", "severity": "error", "rank": 0,
        "summary": "gradprobe itself failed on this target (a bug or an unsupported construct).",
        "why": "The check could not finish; nothing is claimed about the user's code. The evidence holds gradprobe's traceback.",
        "example": "a check raising on an unusual model structure",
        "fix": "This is a gradprobe bug or an unsupported construct; the evidence has the traceback (please report it).",
    },
    "GP106": {
        "name": "missing-super-init", "severity": "error", "rank": 2,
        "summary": "A module class never called super().__init__().",
        "why": "nn.Module.__init__ creates the registries for parameters and submodules; without it assigning a submodule or parameter fails.",
        "example": "class Net(nn.Module):\n    def __init__(self):\n        self.fc = nn.Linear(2, 2)",
        "fix": "Call super().__init__() first in __init__.",
    },
    "GP112": {
        "name": "no-training-step", "severity": "error", "rank": 3,
        "summary": "A script target ran until its timeout (or ended) without reaching a backward/optimizer step.",
        "why": "Nothing about gradients can be measured before the first backward; the finding says how far the script got (last user line, phase).",
        "example": "a training script stuck in data loading, or one that exits before its loop",
        "fix": "Make the script reach its first training step quickly (a small dataset, fewer setup steps), or raise target.timeout_s.",
    },
}

def load_failure_report(tool: str, exc: Any, user: Any) -> dict:
    """GP100 (or GP106 for a missing super().__init__(), GP113 for an allocation a memory limit refused) with the
    user's trimmed traceback."""
    cause = exc.cause or exc
    tb = user.trimmed_traceback(cause) if exc.cause is not None else ""
    loc = user.innermost_of_traceback(cause) if exc.cause is not None else None
    text = str(cause)
    evidence = {"phase": exc.phase, "exception": type(cause).__name__, "traceback": tb}
    finding: Finding
    from gradprobe.checks.torchcompat import MISSING_SUPER_INIT, allocation_failure  # the child has torch

    limit = allocation_failure(exc.cause)
    if limit is not None:
        finding = resource_limit_finding(exc.phase, limit, location=loc, evidence={"traceback": tb})
        return make_report(tool, [finding], [f"The target could not be loaded: a memory limit stopped it ({exc.phase})."])
    if MISSING_SUPER_INIT.search(text):
        cls = _class_of_failing_init(cause)
        finding = make_finding(
            "GP106",
            f"{cls or 'A module class'}.__init__ never called super().__init__(), so assigning a submodule or parameter failed: {text}",
            parameters=[cls] if cls else [], location=loc, evidence=evidence,
            fix="class Net(nn.Module):\n    def __init__(self):\n        super().__init__()  # first line\n        ...",
        )
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


def internal_error_report(tool: str, exc: BaseException) -> dict:
    """GP000: a check of gradprobe raised. Never blamed on the user; the evidence holds our traceback.
    An allocation a memory limit refused inside a check is GP113: a resource limit, not a gradprobe bug."""
    from gradprobe.checks.torchcompat import allocation_failure  # the child has torch

    limit = allocation_failure(exc)
    if limit is not None:
        finding = resource_limit_finding(f"running gradprobe's {tool} check", limit)
        return make_report(tool, [finding], ["A memory limit stopped the check (not a finding about the code)."])
    finding = make_finding(
        "GP000", f"gradprobe's {tool} check failed on this target: {type(exc).__name__}: {exc}",
        evidence={"phase": "checking", "traceback": "".join(traceback.format_exception(exc))[-4000:]},
    )
    return make_report(tool, [finding], ["gradprobe failed while checking this target (an internal error, not a finding about the code)."])

