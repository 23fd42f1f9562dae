"""Text renderings of a report: short for MCP content, coloured for a terminal."""

from __future__ import annotations

import os

_COLORS = {"error": "\033[31m", "warning": "\033[33m", "info": "\033[36m"}
_RESET, _BOLD, _DIM = "\033[0m", "\033[1m", "\033[2m"


def _loc(f: dict) -> str:
    loc = f.get("location") or {}
    if not loc:
        return ""
    return f"{os.path.basename(loc.get('file', '?'))}:{loc.get('line')}" + (f"  {loc['code']}" if loc.get("code") else "")


def render_text(report: dict, *, color: bool = False, max_findings: int = 12) -> str:
    """A readable report: the summary, then each finding with its line and fix."""
    c = (lambda code, s: f"{code}{s}{_RESET}") if color else (lambda code, s: s)
    out = [c(_BOLD, f"gradprobe {report.get('tool')}: " + ("OK" if report.get("ok") else "ERRORS FOUND")), report.get("summary", "")]
    findings = report.get("findings") or []
    for f in findings[:max_findings]:
        sev = f.get("severity", "info")
        out.append("")
        out.append(c(_COLORS.get(sev, ""), f"[{sev}] {f['code']} {f['name']}") + f": {f['message']}")
        params = f.get("parameters") or []
        if params:
            shown = ", ".join(params[:8]) + (f" (+{len(params) - 8} more)" if len(params) > 8 else "")
            out.append(f"  parameters: {shown}")
        where = _loc(f)
        if where:
            out.append(f"  at: {where}")
        tb = (f.get("evidence") or {}).get("traceback")
        if tb and isinstance(tb, str) and f["code"] != "GP000":  # the user's trimmed traceback; GP000's is ours
            lines = tb.strip().splitlines()
            tail = (["..."] if len(lines) > 30 else []) + lines[-30:]
            out.append("  " + "\n  ".join(tail))
        if f.get("fix") and sev != "info":
            fix = f["fix"].replace("\n", "\n       ")
            out.append(c(_DIM, f"  fix: {fix}"))
    if len(findings) > max_findings:
        out.append(f"\n(+{len(findings) - max_findings} more findings in the structured result)")
    return "\n".join(out)
