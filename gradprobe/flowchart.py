"""A picture of the gradient flow: Mermaid text and a dependency-free SVG of the same graph.

The graph is plain data built by the checks: the loss, then one node per module
group of parameters, each "ok", "broken" (with the op and line that cut it),
"unused", "frozen" or "zero".
"""

from __future__ import annotations

import html
import re
from typing import Any

def module_of(name: str) -> str:
    """The module path of a qualified parameter name ("(root)" for the model's own)."""
    return name.rpartition(".")[0] or "(root)"


def flow_graph(table: list[dict], findings: list[Any], frozen: list[str]) -> dict:
    """Module groups of parameters with their status, for the flowchart."""
    breaks: dict[str, dict] = {}
    for f in findings:
        if f["severity"] == "error":
            for n in f["parameters"]:
                breaks.setdefault(n, {"code": f["code"], "op": (f["evidence"].get("op") or f["name"]),
                                      "line": (f.get("location") or {}).get("line")})
    groups: dict[str, dict] = {}
    for row in table:
        m = module_of(row["name"])
        g = groups.setdefault(m, {"module": m, "count": 0, "statuses": set(), "break": None})
        g["count"] += 1
        by_grad = {"ok": "ok", "zero": "zero", "none": "broken" if row["read"] else "unused", "nonfinite": "broken"}
        st = "broken" if row["name"] in breaks else by_grad[row["grad"]]
        g["statuses"].add(st)
        if row["name"] in breaks and g["break"] is None:
            g["break"] = breaks[row["name"]]
    for n in frozen:
        m = module_of(n)
        g = groups.setdefault(m, {"module": m, "count": 0, "statuses": set(), "break": None})
        g["count"] += 1
        g["statuses"].add("frozen")
    out = []
    for g in groups.values():
        st = next((s for s in ("broken", "zero", "unused", "ok", "frozen") if s in g["statuses"]), "ok")
        out.append({"module": g["module"], "count": g["count"], "status": st, "break": g["break"]})
    out.sort(key=lambda g: ("ok", "frozen", "unused", "zero", "broken").index(g["status"]), reverse=True)
    return {"loss": "loss", "groups": out[:40]}


_STYLE = {
    "ok": ("#e8f5e9", "#2e7d32"),
    "broken": ("#ffebee", "#c62828"),
    "zero": ("#fff8e1", "#f9a825"),
    "unused": ("#f5f5f5", "#9e9e9e"),
    "frozen": ("#eceff1", "#607d8b"),
}


MAX_GROUPS = 200
_CODE = re.compile(r"GP\d{3}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _text(value: Any, cap: int, default: str = "") -> str:
    return _CONTROL.sub(" ", value)[:cap] if isinstance(value, str) else default


def clean_graph(graph: Any) -> dict[str, Any]:
    """The graph with every field type-checked and capped: it comes from the child, so it is untrusted."""
    if not isinstance(graph, dict):
        return {"loss": "loss", "groups": []}
    groups = []
    given = graph.get("groups")
    for g in (given if isinstance(given, list) else [])[:MAX_GROUPS]:
        if not isinstance(g, dict):
            continue
        status = g.get("status") if g.get("status") in _STYLE else "ok"
        count = g.get("count") if isinstance(g.get("count"), int) and not isinstance(g.get("count"), bool) else 0
        item = {"module": _text(g.get("module"), 120, "?"), "count": count, "status": status}
        brk = g.get("break")
        if status == "broken" and isinstance(brk, dict):
            code = brk.get("code") if isinstance(brk.get("code"), str) and _CODE.fullmatch(brk["code"]) else "GP???"
            line = brk.get("line") if isinstance(brk.get("line"), int) and not isinstance(brk.get("line"), bool) else None
            item["break"] = {"code": code, "op": _text(brk.get("op"), 80), "line": line}
        groups.append(item)
    return {"loss": _text(graph.get("loss"), 60, "loss") or "loss", "groups": groups}


def _mm(text: str) -> str:
    """Text safe inside a quoted Mermaid label (entity codes for what could end the label or open markup)."""
    for ch, code in (("&", "#amp;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("|", "#124;"), ("`", "#96;")):
        text = text.replace(ch, code)
    return text


def _id(text: str) -> str:
    return "n_" + re.sub(r"\W", "_", text)


def flow_mermaid(graph: dict) -> str:
    graph = clean_graph(graph)
    lines = ["flowchart LR", f'    loss(["{_mm(graph["loss"])}"])']
    for g in graph["groups"]:
        nid = _id(g["module"])
        label = f'{_mm(g["module"])}<br/>{g["count"]} param(s): {g["status"]}'
        lines.append(f'    {nid}["{label}"]')
        brk = g.get("break")
        if g["status"] == "broken" and brk:
            where = f' at line {brk["line"]}' if brk.get("line") else ""
            lines.append(f'    loss -. "{brk["code"]} {_mm(brk["op"])}{where}" .-x {nid}')
        elif g["status"] in ("unused", "frozen"):
            lines.append(f"    loss ~~~ {nid}")
        else:
            lines.append(f"    loss --> {nid}")
        lines.append(f"    class {nid} {g['status']}")
    for status, (fill, stroke) in _STYLE.items():
        lines.append(f"    classDef {status} fill:{fill},stroke:{stroke}")
    return "\n".join(lines)


def flow_svg(graph: dict) -> str:
    graph = clean_graph(graph)
    groups = graph["groups"]
    row_h, width = 46, 720
    height = 70 + row_h * max(1, len(groups))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<rect x="10" y="{height // 2 - 18}" width="90" height="36" rx="18" fill="#e3f2fd" stroke="#1565c0"/>',
        f'<text x="55" y="{height // 2 + 5}" text-anchor="middle">{html.escape(graph["loss"])}</text>',
    ]
    for i, g in enumerate(groups):
        y = 40 + i * row_h
        fill, stroke = _STYLE.get(g["status"], _STYLE["ok"])
        dash = ' stroke-dasharray="6,4"' if g["status"] != "ok" else ""
        parts.append(f'<line x1="100" y1="{height // 2}" x2="360" y2="{y + 16}" stroke="{stroke}" stroke-width="2"{dash}/>')
        brk = g.get("break")
        if g["status"] == "broken" and brk:
            mx, my = 230, (height // 2 + y + 16) // 2
            parts.append(f'<text x="{mx}" y="{my - 10}" fill="{stroke}" text-anchor="middle" font-size="11">'
                         f'✗ {html.escape(brk["code"] + " " + brk["op"])}'
                         + (f' line {brk["line"]}' if brk.get("line") else "") + '</text>')
        parts.append(f'<rect x="360" y="{y}" width="340" height="32" rx="4" fill="{fill}" stroke="{stroke}"/>')
        label = f'{g["module"]} ({g["count"]}): {g["status"]}'
        parts.append(f'<text x="370" y="{y + 21}">{html.escape(label[:48])}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
