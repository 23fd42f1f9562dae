"""What a call's report adds about how it ran (parent side, torch-free): which interpreter ran the code and why, a
module that interpreter lacked, a script's last output, a path outside the sandbox's view, and how to give more memory.

These are lines of the report's summary (and facts.interpreter), never findings: the findings stay the rules' own.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from gradprobe.outcomes import GP100, GP113
from gradprobe.sandbox.failures import GP112
from gradprobe.sandbox.interpreter import Interpreter, describe, missing_module_hint
from gradprobe.sandbox.roots import resolved_inside
from gradprobe.target import Target

GIB = 1024**3
_PATH_ERROR = re.compile(r"(?:No such file or directory|Permission denied|Not a directory): '(/[^']*)'")


def _findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report.get("findings") or [])


def add_lines(report: dict[str, Any], *lines: str | None) -> dict[str, Any]:
    """Append the non-empty `lines` to the report's summary."""
    report["summary"] = "\n".join(x for x in (str(report.get("summary") or ""), *lines) if x)
    return report


def outside_view(report: dict[str, Any], target: Target, roots: tuple[str, ...]) -> str | None:
    """A path the user's code failed on that exists outside the sandbox's view: say so, and how to allow it."""
    seen = [target.project_dir, *target.read_paths]
    for f in _findings(report):
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
    return resolved_inside(path, [d for d in dirs if d])


def memory_hint(report: dict[str, Any], cap: int | None) -> str | None:
    """GP113: how much the check had and the exact option that gives it more."""
    for f in _findings(report):
        limit = (f.get("evidence") or {}).get("limit") or {}
        if f.get("code") != GP113.code or not cap or limit.get("device") in ("cuda", "mps"):
            continue
        asked = limit.get("requested_bytes")
        asked = asked if isinstance(asked, int) and asked > 0 else 0
        more = asked > 0
        need = math.ceil((cap + asked) / GIB) + 1 if more else math.ceil(2 * cap / GIB)
        what = f"; the step asked for {asked / GIB:.1f} GB more" if more else ""
        return (f"This check was capped at {cap / GIB:.1f} GB{what}. Give it more: \"memory_gb\": {need} in the target "
                f"(command line: gradprobe diagnose --memory-gb {need}), up to the server's ceiling (--max-memory-gb).")
    return None


def annotate(report: dict[str, Any], interp: Interpreter) -> dict[str, Any]:
    """Every report says which interpreter ran, its versions (the child's word) and why it was chosen; a module the
    interpreter lacked is named with it; a script that reached no step shows its own last output (its usage message)."""
    facts = report.setdefault("facts", {})
    runtime = facts.pop("runtime", None)
    info = interp.facts()
    if isinstance(runtime, dict):
        info.update({k: runtime.get(k) for k in ("python_version", "torch_version")})
    facts["interpreter"] = info
    missing = _missing_module(report)
    script = any(f.get("code") == GP112.code for f in _findings(report))
    return add_lines(report, describe(info), missing_module_hint(missing, info) if missing else None,
                     _script_output(facts.get("sandbox") or {}) if script else None)


def _script_output(sandbox: dict[str, Any], keep: int = 12) -> str:
    shown = []
    for stream in ("stderr_tail", "stdout_tail"):
        tail = [line for line in str(sandbox.get(stream) or "").splitlines() if line.strip()][-keep:]
        if tail:
            shown.append(f"The script's last output ({stream.split('_')[0]}):\n  " + "\n  ".join(tail))
    return "\n".join(shown)


def _missing_module(report: dict[str, Any]) -> str | None:
    for f in _findings(report):
        ev = f.get("evidence") or {}
        if f.get("code") in (GP100.code, GP112.code) and ev.get("exception") == "ModuleNotFoundError":
            text = f"{f.get('message', '')} {ev.get('traceback', '')}"
            i = text.find("No module named ")
            if i >= 0:
                return text[i + 16:].split()[0].strip("'\".,:;)")
            return "?"
    return None
