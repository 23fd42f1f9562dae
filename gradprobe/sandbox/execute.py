"""One tool call end to end on the parent side: validate paths, run the child, turn its fate into a report."""

from __future__ import annotations

from typing import Any

from gradprobe.findings import make_finding
from gradprobe.report import make_report
from gradprobe.sandbox.executor import Executor, LocalExecutor
from gradprobe.sandbox.failures import resource_limit_finding
from gradprobe.sandbox.runner import Limits, ProgressFn, ToolInputError, describe_exit
from gradprobe.target import Target


async def execute(
    tool: str,
    target: Target,
    options: dict | None = None,
    *,
    progress: ProgressFn | None = None,
    limits: Limits | None = None,
    executor: Executor | None = None,
) -> dict:
    """Run `tool` on `target` in a fresh sandboxed child (a cold local one unless `executor` says otherwise;
    `limits` overrides the executor's). Raises ToolInputError for caller mistakes."""
    try:
        target.check_paths()
    except ValueError as exc:
        raise ToolInputError(str(exc)) from exc
    job = {"tool": tool, "target": target.model_dump(), "options": options or {}}
    executor = executor or LocalExecutor(limits)
    outcome = await executor.run(job, python=target.python, timeout_s=target.timeout_s, progress=progress, limits=limits)
    sandbox: dict[str, Any] = {
        "seconds": round(outcome.seconds, 3),
        "child": {"warm": "forked from the warm worker", "ray": "a Ray task (cold interpreter on the worker)"}.get(outcome.mode, "cold interpreter"),
        "note": outcome.note,
        "phases": outcome.events,
        "returncode": outcome.returncode,
        "stdout_tail": outcome.stdout[-2000:],
        "stderr_tail": outcome.stderr[-4000:],
        "isolation": {"process": "separate child, own process group", "environment": "allow-list",
                      "limits": "rlimits (address space on CPU, CPU time, file size, open files)",
                      "timeout_s": target.timeout_s},
    }
    sandbox["isolation"].update(outcome.isolation)  # what the server applied and checked, never the child's word
    if outcome.tool_error is not None:
        if outcome.tool_error_kind == "interpreter":
            raise ToolInputError(f"python {target.python or '(server interpreter)'}: {outcome.tool_error}")
        raise ToolInputError(outcome.tool_error)
    if outcome.report is not None and not outcome.timed_out:
        report = outcome.report
        report.setdefault("facts", {})["sandbox"] = sandbox
        return report
    if outcome.timed_out:
        msg = f"The target did not finish within {target.timeout_s:g} s (it was in phase '{outcome.phase}'); its process tree was killed."
        fix = "Look for an endless loop or a very slow step in that phase, or raise target.timeout_s."
    elif outcome.mode == "ray" and outcome.note and outcome.report is None:
        msg = f"{outcome.note}: {outcome.stderr.splitlines()[0] if outcome.stderr else ''}"
        fix = "Check the Ray cluster (the worker's logs); the call can be retried."
    elif outcome.oom:  # a resource limit, measured by the cgroup: neither the code's error nor ours
        cap = (limits or executor.limits).memory_bytes
        finding = resource_limit_finding(
            outcome.phase, {"device": "cgroup", "memory_bytes": cap},
            evidence={"returncode": outcome.returncode, "stderr_tail": outcome.stderr[-4000:], "stdout_tail": outcome.stdout[-1000:]})
        report = make_report(tool, [finding], ["The check could not finish: the child was killed for memory (a resource limit)."])
        report["facts"]["sandbox"] = sandbox
        return report
    else:
        msg = f"The child process {describe_exit(outcome.returncode)} in phase '{outcome.phase}' without a result."
        fix = "See evidence.stderr_tail for the crash (a segfault in an extension, os._exit, an out-of-memory kill)."
    code = "GP100"
    if outcome.timed_out and (target.script or target.module) and outcome.phase == "running the script":
        code = "GP112"  # the script's own timer could not interrupt it (a blocking C call, e.g. a network wait)
        msg = (f"The script reached no training step within {target.timeout_s:g} s: it was blocked where gradprobe's "
               "timer could not stop it (a call in C, e.g. a rendezvous or a network wait); its process tree was killed.")
        fix = "Look for a wait that never returns before the first step (a rendezvous for more ranks, a download), or raise target.timeout_s."
    finding = make_finding(
        code, msg,
        evidence={"phase": outcome.phase, "timed_out": outcome.timed_out, "returncode": outcome.returncode,
                  "stderr_tail": outcome.stderr[-4000:], "stdout_tail": outcome.stdout[-1000:]},
        fix=fix,
    )
    report = make_report(tool, [finding], ["The target could not be checked."])
    report["facts"]["sandbox"] = sandbox
    return report
