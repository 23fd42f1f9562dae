"""One tool call end to end on the parent side: validate paths, run the child, turn its fate into a report."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

from gradprobe.findings import make_finding
from gradprobe.report import make_report
from gradprobe.sandbox.executor import Executor, LocalExecutor
from gradprobe.sandbox.failures import resource_limit_finding
from gradprobe.sandbox.interpreter import (HOW_TO_NAME, SUPPORTED, Interpreter, InterpreterPolicy, choose, describe,
                                          missing_module_hint)
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
    interpreters: InterpreterPolicy | None = None,
) -> dict:
    """Run `tool` on `target` in a fresh sandboxed child (a cold local one unless `executor` says otherwise;
    `limits` overrides the executor's; `interpreters` is what the server accepts). Raises ToolInputError for caller
    mistakes."""
    try:
        target.check_paths()
        interp = choose(target.python, target.project_dir, interpreters)
    except ValueError as exc:
        raise ToolInputError(str(exc)) from exc
    if target.memory_gb:  # the target's own cap (the server checked it against its ceiling)
        base = limits or (executor.limits if executor is not None else Limits())
        limits = dataclasses.replace(base, memory_bytes=int(target.memory_gb * _GIB))
    try:
        report = await _execute(tool, target, options, interp, progress, limits, executor)
    finally:
        interp.close()
    cap = (limits or (executor.limits if executor is not None else Limits())).memory_bytes
    lines = [_outside_view(report, target, interpreters.roots if interpreters else ()), _memory_hint(report, cap)]
    report["summary"] = "\n".join([str(report.get("summary") or ""), *(x for x in lines if x)])
    return report


_GIB = 1024**3
_PATH_ERROR = re.compile(r"(?:No such file or directory|Permission denied|Not a directory): '(/[^']*)'")


def _outside_view(report: dict, target: Target, roots: tuple[str, ...]) -> str | None:
    """A path the user's code failed on that exists outside the sandbox's view: say so, and how to allow it."""
    seen = [target.project_dir, *target.read_paths]
    for f in report.get("findings") or []:
        ev = f.get("evidence") or {}
        match = _PATH_ERROR.search(f"{f.get('message', '')} {ev.get('traceback', '')}")
        if not match or _under(match.group(1), seen):
            continue
        path = match.group(1)
        if roots and not _under(path, list(roots)):
            return (f"{path!r} is not in the sandbox's view: this server lets a call read only inside its allowed roots "
                    f"({', '.join(roots)}) and names no other path.")
        if os.path.exists(path):
            allow = path if os.path.isdir(path) else os.path.dirname(path)
            return (f"{path!r} exists on this machine, outside the sandbox's view (the child sees the project, the Python "
                    f'installation and the paths the target names). Allow it read-only with "read_paths": ["{allow}"] in '
                    f"the target (command line: --read-path {allow}).")
    return None


def _under(path: str, dirs: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(d and (real == os.path.realpath(d) or real.startswith(os.path.realpath(d).rstrip("/") + "/")) for d in dirs)


def _memory_hint(report: dict, cap: int | None) -> str | None:
    """GP113: how much the check had and the exact option that gives it more."""
    for f in report.get("findings") or []:
        limit = (f.get("evidence") or {}).get("limit") or {}
        if f.get("code") != "GP113" or not cap or limit.get("device") in ("cuda", "mps"):
            continue
        asked = limit.get("requested_bytes")
        need = math.ceil((cap + asked) / _GIB) + 1 if isinstance(asked, int) and asked > 0 else math.ceil(2 * cap / _GIB)
        what = f"; the step asked for {asked / _GIB:.1f} GB more" if isinstance(asked, int) and asked > 0 else ""
        return (f"This check was capped at {cap / _GIB:.1f} GB{what}. Give it more: \"memory_gb\": {need} in the target "
                f"(command line: gradprobe diagnose --memory-gb {need}), up to the server's ceiling (--max-memory-gb).")
    return None


def _annotate(report: dict, interp: Interpreter) -> dict:
    """Every report says which interpreter ran, its versions (the child's word) and why it was chosen; a module the
    interpreter lacked is named with it; a script that reached no step shows its own last output (its usage message)."""
    facts = report.setdefault("facts", {})
    runtime = facts.pop("runtime", None)
    info = interp.facts()
    if isinstance(runtime, dict):
        info.update({k: runtime.get(k) for k in ("python_version", "torch_version")})
    facts["interpreter"] = info
    lines = [str(report.get("summary") or ""), describe(info)]
    missing = _missing_module(report)
    if missing:
        lines.append(missing_module_hint(missing, info))
    if any(f.get("code") == "GP112" for f in report.get("findings") or []):
        lines.append(_script_output(facts.get("sandbox") or {}))
    report["summary"] = "\n".join(x for x in lines if x)
    return report


def _script_output(sandbox: dict, keep: int = 12) -> str:
    shown = []
    for stream in ("stderr_tail", "stdout_tail"):
        tail = [line for line in str(sandbox.get(stream) or "").splitlines() if line.strip()][-keep:]
        if tail:
            shown.append(f"The script's last output ({stream.split('_')[0]}):\n  " + "\n  ".join(tail))
    return "\n".join(shown)


def _missing_module(report: dict) -> str | None:
    for f in report.get("findings") or []:
        ev = f.get("evidence") or {}
        if f.get("code") in ("GP100", "GP112") and ev.get("exception") == "ModuleNotFoundError":
            text = f"{f.get('message', '')} {ev.get('traceback', '')}"
            i = text.find("No module named ")
            if i >= 0:
                return text[i + 16:].split()[0].strip("'\".,:;)")
            return "?"
    return None


async def _execute(tool: str, target: Target, options: dict | None, interp: Interpreter, progress: ProgressFn | None,
                   limits: Limits | None, executor: Executor | None) -> dict:
    job = {"tool": tool, "target": target.model_dump(), "options": options or {}}
    executor = executor or LocalExecutor(limits)
    # a local child runs exactly the file resolved here; a remote one (Ray) resolves the path again on its machine
    python: Interpreter | str | None = None
    if not interp.is_server:
        python = interp if isinstance(executor, LocalExecutor) else interp.path
    outcome = await executor.run(job, python=python,  # type: ignore[arg-type]
                                 timeout_s=target.timeout_s, progress=progress, limits=limits)
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
            raise ToolInputError(f"python {interp.path} ({interp.reason}): {outcome.tool_error}; {HOW_TO_NAME}")
        raise ToolInputError(outcome.tool_error)
    if outcome.report is not None and not outcome.timed_out:
        report = outcome.report
        report.setdefault("facts", {})["sandbox"] = sandbox
        return _annotate(report, interp)
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
        return _annotate(report, interp)
    elif outcome.phase == "starting" and not interp.is_server:  # no user code ran: the interpreter could not start ours
        msg = (f"The interpreter {interp.path} ({interp.reason}) {describe_exit(outcome.returncode)} before gradprobe's child "
               f"started: it is not a Python that can run gradprobe ({SUPPORTED}), or it failed at start. No user code ran.")
        fix = f"See evidence.stderr_tail for what it printed; {HOW_TO_NAME}."
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
    return _annotate(report, interp)
