"""The finding shape and the catalogue of stable codes (spec/findings.md).

A finding code is a unit, the way a lint rule is one in ruff: each module that
decides codes declares them in one literal `RULES` dict beside the function
that emits them: name, severity, rank in root-cause order (lower explains more;
diagnose ranks and folds by it), whether a parameterless finding of it is a
consequence of another error, and its docs with the one fix text. Every emitter
names its code literally, so `grep GP302 gradprobe/` shows the declaration and
each emitter. This module only collects the declarations, by reading those
literals with `ast`, so that the server can serve the catalogue without torch.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any, Literal, cast

from typing_extensions import TypedDict

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}

# the modules that declare codes, relative to the package
RULE_MODULES = ("sandbox/failures.py", "checks/registration.py", "checks/optimizer.py", "checks/trace.py",
                "checks/gradcheck.py", "checks/prompt_tuning.py")


class Location(TypedDict):
    file: str
    line: int
    function: str
    code: str


class Finding(TypedDict):
    code: str
    name: str
    severity: Severity
    message: str
    parameters: list[str]
    location: Location | None
    evidence: dict[str, Any]
    fix: str


class Rule(TypedDict):
    code: str
    name: str
    severity: Severity
    rank: int
    consequence: bool
    summary: str
    why: str
    example: str
    fix: str


def _rules_of(path: Path) -> dict[str, dict[str, Any]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RULES" for t in node.targets):
            rules: dict[str, dict[str, Any]] = ast.literal_eval(node.value)
            return rules
    return {}


@functools.cache
def catalogue() -> dict[str, Rule]:
    """Every code, collected from the check modules, in code order."""
    out: dict[str, Rule] = {}
    here = Path(__file__).parent
    for mod in RULE_MODULES:
        for code, rule in _rules_of(here / mod).items():
            out[code] = cast(Rule, {"code": code, "consequence": False, **rule})
    return dict(sorted(out.items()))


def make_finding(
    code: str,
    message: str,
    *,
    parameters: list[str] | None = None,
    location: Location | dict[str, Any] | None = None,
    evidence: dict[str, Any] | None = None,
    fix: str | None = None,
    severity: Severity | None = None,
) -> Finding:
    """Build a finding of a catalogued code; name, severity and the default fix come from the catalogue
    (`severity` overrides it where the measured cause makes the same fact less severe: by design, not a bug)."""
    rule = catalogue()[code]
    return Finding(
        code=code,
        name=rule["name"],
        severity=severity or rule["severity"],
        message=message,
        parameters=list(parameters or []),
        location=cast("Location | None", location),
        evidence=dict(evidence or {}),
        fix=fix or rule["fix"],
    )


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_RANK[f["severity"]])
