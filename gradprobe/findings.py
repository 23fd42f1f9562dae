"""The finding shape and the catalogue of stable codes (spec/findings.md).

Each check module keeps its own rules (code, name, severity and docs) in a
literal `RULES` dict next to the logic, the way ruff keeps a rule's docs beside
its code. This module only collects them, by reading those literals with `ast`,
so that the server can serve the catalogue without importing torch.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any, Literal

from typing_extensions import TypedDict

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}

CHECK_MODULES = ("registration", "optimizer", "trace", "gradcheck", "prompt_tuning", "scriptcodes")


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
    summary: str
    why: str
    example: str
    fix: str


def _rules_of(path: Path) -> dict[str, dict]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "RULES" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


@functools.cache
def catalogue() -> dict[str, Rule]:
    """Every code, collected from the check modules, in code order."""
    out: dict[str, Rule] = {}
    here = Path(__file__).parent / "checks"
    for mod in CHECK_MODULES:
        for code, rule in _rules_of(here / f"{mod}.py").items():
            out[code] = Rule(code=code, **rule)
    return dict(sorted(out.items()))


def make_finding(
    code: str,
    message: str,
    *,
    parameters: list[str] | None = None,
    location: Location | None = None,
    evidence: dict[str, Any] | None = None,
    fix: str | None = None,
    severity: Severity | None = None,
) -> Finding:
    """Build a finding of a catalogued code; name and default severity come from the catalogue."""
    rule = catalogue()[code]
    return Finding(
        code=code,
        name=rule["name"],
        severity=severity or rule["severity"],
        message=message,
        parameters=list(parameters or []),
        location=location,
        evidence=dict(evidence or {}),
        fix=fix or rule["fix"],
    )


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_RANK[f["severity"]])
