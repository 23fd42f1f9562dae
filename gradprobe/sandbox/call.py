"""One tool call end to end on the parent side: validate paths, run the child, turn its fate into a report."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio

from gradprobe.errors import ToolInputError
from gradprobe.outcomes import resource_limit_finding
from gradprobe.report import make_report
from gradprobe.verdict import settle
from gradprobe.sandbox.executor import Executor, LocalExecutor
from gradprobe.sandbox.failures import ChildFate, child_failure_finding
from gradprobe.sandbox.hints import GIB, add_lines, annotate, memory_hint, outside_view
from gradprobe.sandbox.project_imports import project_modules
from gradprobe.sandbox.interpreter import HOW_TO_NAME, Interpreter, InterpreterPolicy, choose
from gradprobe.sandbox.protocol import Job
from gradprobe.sandbox.runner import ChildOutcome, Limits, ProgressFn
from gradprobe.target import Target

_CHILD_KIND = {"warm": "forked from the warm worker", "ray": "a Ray task (cold interpreter on the worker)"}


async def execute(
    tool: str,
    target: Target,
    options: dict[str, Any] | None = None,
    *,
    progress: ProgressFn | None = None,
    limits: Limits | None = None,
    executor: Executor | None = None,
    interpreters: InterpreterPolicy | None = None,
    roots: list[str] | None = None,
) -> dict[str, Any]:
    """Run `tool` on `target` in a fresh sandboxed child (a cold local one unless `executor` says otherwise;
    `limits` overrides the executor's; `interpreters` is what the server accepts; `roots` the caller's roots, when
    they are not the executor's own). Raises ToolInputError for caller mistakes."""
    def look() -> Interpreter:  # file-system work (and maybe `conda env list`): off the event loop
        target.check_paths()
        return choose(target.python, target.project_dir, interpreters)

    try:
        with anyio.CancelScope(shield=True):  # the interpreter it returns holds open files: always closed below
            interp = await anyio.to_thread.run_sync(look)
    except ValueError as exc:
        raise ToolInputError(str(exc)) from exc
    executor = executor or LocalExecutor(limits)
    if target.memory_gb:  # the target's own cap (the server checked it against its ceiling)
        limits = dataclasses.replace(limits or executor.limits, memory_bytes=int(target.memory_gb * GIB))
    try:
        report = await _execute(tool, target, options, interp, progress, limits, executor, roots)
    finally:
        interp.close()
    shown = tuple(roots) if roots is not None else interpreters.roots if interpreters else ()
    report = add_lines(report, outside_view(report, target, shown), memory_hint(report, (limits or executor.limits).memory_bytes))
    return settle(report)  # the verdict again, from the findings and facts as they reached the parent


async def _execute(tool: str, target: Target, options: dict[str, Any] | None, interp: Interpreter,
                   progress: ProgressFn | None, limits: Limits | None, executor: Executor,
                   roots: list[str] | None) -> dict[str, Any]:
    job = Job(tool=tool, target=target.model_dump(), options=options or {})
    # a local child runs exactly the file resolved here; a remote one (Ray) resolves the path again on its machine
    if isinstance(executor, LocalExecutor):
        outcome = await executor.run(job, python=None if interp.is_server else interp, timeout_s=target.timeout_s,
                                     progress=progress, limits=limits, allowed_roots=roots)
    else:
        outcome = await executor.run(job, python=None if interp.is_server else interp.path, timeout_s=target.timeout_s,
                                     progress=progress, limits=limits, allowed_roots=roots)
    sandbox = _sandbox_facts(outcome, target)
    if outcome.tool_error is not None:
        if outcome.tool_error_kind == "interpreter":
            raise ToolInputError(f"python {interp.path} ({interp.reason}): {outcome.tool_error}; {HOW_TO_NAME}")
        raise ToolInputError(outcome.tool_error)
    if outcome.report is not None and not outcome.timed_out:
        return annotate(project_modules(server_account(outcome.report, sandbox), target), interp)
    fate = _fate(outcome, target, interp)
    if outcome.oom and fate.cause == "died":  # a resource limit, measured by the cgroup: neither the code's error nor ours
        cap = (limits or executor.limits).memory_bytes
        finding = resource_limit_finding(
            fate.phase, {"device": "cgroup", "memory_bytes": cap},
            evidence={"returncode": outcome.returncode, "stderr_tail": outcome.stderr[-4000:],
                      "stdout_tail": outcome.stdout[-1000:]})
        report = make_report(tool, [finding], ["The check could not finish: the child was killed for memory (a resource limit)."])
    else:
        report = make_report(tool, [child_failure_finding(fate, outcome.stderr)],
                             ["The target could not be checked."])
    report["facts"]["sandbox"] = sandbox
    return annotate(report, interp)


CLAIMS = ("sandbox", "isolation", "verified_by_server")  # keys only the server's own account may hold


def _drop_claims(value: Any, depth: int = 0) -> Any:
    if depth > 32:
        return None
    if isinstance(value, dict):
        return {k: _drop_claims(v, depth + 1) for k, v in value.items() if k not in CLAIMS}
    if isinstance(value, list):
        return [_drop_claims(v, depth + 1) for v in value]
    return value


def server_account(report: dict[str, Any], sandbox: dict[str, Any]) -> dict[str, Any]:
    """The child's report with the server's own account of the call in facts.sandbox. The child writes its own
    result (the user's code runs in that process), so whatever it wrote about the sandbox or isolation, at any depth
    of its facts, is dropped: what the answer says about isolation is only what the server applied and verified."""
    facts = report.get("facts")
    report["facts"] = _drop_claims(facts) if isinstance(facts, dict) else {}
    report["facts"]["sandbox"] = sandbox
    return report


def _fate(outcome: ChildOutcome, target: Target, interp: Interpreter) -> ChildFate:
    remote = outcome.note if outcome.mode == "ray" and outcome.note and outcome.report is None else None
    phase = str(outcome.phase)
    return ChildFate(
        phase=phase, timed_out=outcome.timed_out, returncode=outcome.returncode, timeout_s=target.timeout_s,
        script=bool(target.script or target.module), remote_note=remote, start_error=outcome.start_error,
        python=None if interp.is_server else interp.path, python_reason=interp.reason,
        evidence={"phase": phase, "timed_out": outcome.timed_out, "returncode": outcome.returncode,
                  "stderr_tail": outcome.stderr[-4000:], "stdout_tail": outcome.stdout[-1000:]},
    )


def _sandbox_facts(outcome: ChildOutcome, target: Target) -> dict[str, Any]:
    isolation: dict[str, Any] = {
        "process": "separate child, own process group", "environment": "allow-list",
        "limits": "rlimits (address space on CPU, CPU time, file size, open files)", "timeout_s": target.timeout_s,
    }
    isolation.update(outcome.isolation)  # what the server applied and checked, never the child's word
    return {
        "seconds": round(outcome.seconds, 3),
        "child": _CHILD_KIND.get(outcome.mode, "cold interpreter"),
        "note": outcome.note,
        "phases": outcome.events,
        "returncode": outcome.returncode,
        "stdout_tail": outcome.stdout[-2000:],
        "stderr_tail": outcome.stderr[-4000:],
        "isolation": isolation,
    }
