"""The report every tool returns, as a plain dict (no torch, no pydantic: the child builds it too)."""

from __future__ import annotations

from typing import Any

from gradprobe.findings import Finding, sort_findings
from gradprobe.outcomes import stopped_by_limit


def make_report(tool: str, findings: list[Finding], summary: list[str] | None = None, **facts: Any) -> dict:
    findings = sort_findings(findings)
    errors = [f for f in findings if f["severity"] == "error"]
    lines = list(summary or [])
    if errors:
        top = errors[0]
        head = f"{top['code']} {top['name']}: {top['message']}"
        fix = top["fix"].splitlines()[0] if top["fix"] else ""
        lines.insert(0, head + (f" Fix: {fix}" if fix else ""))
        if len(errors) > 1:
            lines.insert(1, f"{len(errors) - 1} more error(s): " + ", ".join(f["code"] for f in errors[1:]))
    else:
        warn = [f for f in findings if f["severity"] == "warning"]
        # GP113 (resource-limit): the check stopped at a memory limit, so "no error" covers only what ran
        head = ("No error found in what ran; the check did not finish (GP113: a memory limit stopped it)."
                if stopped_by_limit(findings) else "No error found.")
        lines.insert(0, head + (f" {len(warn)} warning(s): " + ", ".join(f["code"] for f in warn) if warn else ""))
    return {"tool": tool, "ok": not errors, "findings": findings, "summary": "\n".join(lines), "facts": facts}
