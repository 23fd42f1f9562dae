"""The report every tool returns, as a plain dict (no torch, no pydantic: the child builds it too).

Its verdict (what was verified, what did not run and why, or the problems found) is computed from the findings and
the facts by gradprobe/verdict.py, which also writes the summary's first line(s): `summary` here is the body below it.
"""

from __future__ import annotations

from typing import Any

from gradprobe.findings import Finding, sort_findings
from gradprobe.verdict import settle


def make_report(tool: str, findings: list[Finding], summary: list[str] | None = None, **facts: Any) -> dict:
    """A report: the findings (errors first), the summary's body lines and the tool's facts; `verdict`, `ok` and the
    summary's head are settled from them (gradprobe.verdict.settle)."""
    return settle({"tool": tool, "ok": False, "findings": sort_findings(findings), "summary": "\n".join(summary or []),
                   "facts": facts})
