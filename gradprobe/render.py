"""Text renderings of a report: short for MCP content, coloured for a terminal."""

from __future__ import annotations

import os
import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 (but tab and newline), DEL, C1: escapes, OSC, BEL


def clean(text: object) -> str:
    """Text user code can influence, with every terminal control character removed."""
    return _CONTROL.sub("", str(text))

_COLORS = {"error": "\033[31m", "warning": "\033[33m", "info": "\033[36m"}
_RESET, _BOLD, _DIM = "\033[0m", "\033[1m", "\033[2m"
# the verdict's status as the title says it (gradprobe/verdict.py): never "OK" over a check that did not run
_TITLES = {"verified": "VERIFIED", "problems": "PROBLEMS FOUND", "partial": "PARTLY CHECKED", "not_checked": "NOT CHECKED"}


def _loc(f: dict) -> str:
    loc = f.get("location") or {}
    if not loc:
        return ""
    code = f"  {loc['code']}" if loc.get("code") else ""
    return clean(f"{os.path.basename(str(loc.get('file', '?')))}:{loc.get('line')}" + code)


def render_text(report: dict, *, color: bool = False, max_findings: int = 12) -> str:
    """A readable report: the summary, then each finding with its line and fix."""
    c = (lambda code, s: f"{code}{s}{_RESET}") if color else (lambda code, s: s)
    status = (report.get("verdict") or {}).get("status") if isinstance(report.get("verdict"), dict) else None
    title = _TITLES.get(str(status), "NOT CHECKED")
    out = [c(_BOLD, f"gradprobe {clean(report.get('tool'))}: {title}"), clean(report.get("summary", ""))]
    findings = report.get("findings") or []
    for f in findings[:max_findings]:
        sev = clean(f.get("severity", "info"))
        out.append("")
        out.append(c(_COLORS.get(sev, ""), clean(f"[{sev}] {f['code']} {f['name']}")) + ": " + clean(f["message"]))
        params = [clean(p) for p in f.get("parameters") or []]
        if params:
            shown = ", ".join(params[:8]) + (f" (+{len(params) - 8} more)" if len(params) > 8 else "")
            out.append(f"  parameters: {shown}")
        where = _loc(f)
        if where:
            out.append(f"  at: {where}")
        tb = (f.get("evidence") or {}).get("traceback")
        if tb and isinstance(tb, str) and f["code"] != "GP000":  # the user's trimmed traceback; GP000's is ours
            lines = clean(tb).strip().splitlines()
            tail = (["..."] if len(lines) > 30 else []) + lines[-30:]
            out.append("  " + "\n  ".join(tail))
        if f.get("fix") and sev != "info":
            fix = clean(f["fix"]).replace("\n", "\n       ")
            out.append(c(_DIM, f"  fix: {fix}"))
    if len(findings) > max_findings:
        out.append(f"\n(+{len(findings) - max_findings} more findings in the structured result)")
    return "\n".join(out)
