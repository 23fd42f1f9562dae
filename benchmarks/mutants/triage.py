"""Group the bench's misses by operator and cause (for people fixing them): `--triage out.md`."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any


def cause(r: dict[str, Any]) -> str:
    """Why a row is not a hit with the right line."""
    exp = r.get("expected") or {}
    fs = r.get("findings") or []
    if r.get("error"):
        return f"tool error: {str(r['error'])[:80]}"
    internal = [f for f in fs if f["code"] in ("GP000", "GP100", "GP114", "GP115", "GP116", "GP117")
                and "gradprobe" in (f.get("message") or "")]
    if not r.get("ok"):
        if internal:
            return f"gradprobe crashed ({internal[0]['code']}): {internal[0]['message'][:90]}"
        codes = set(exp.get("codes") or [])
        if r.get("code_seen"):
            return "right code, not every culprit named (split over several findings, or some missing)"
        errs = sorted({f["code"] for f in fs if f.get("severity") == "error"})
        others = sorted({f["code"] for f in fs} - {"GP108", "GP105"})
        return f"wrong code: wanted {sorted(codes)}, got {errs or others or 'nothing'}"
    hits = [f for f in fs if f["code"] in set(exp.get("codes") or [])]
    if all(f.get("line") is None for f in hits):
        return "right code, no location"
    want_file = exp.get("file") or "case.py"
    if all(not str(f.get("file") or "").endswith(want_file) for f in hits if f.get("line") is not None):
        return "right code, location in another file"
    return "right code, wrong line"


def write(rows: list[dict[str, Any]], path: str, header: str) -> None:
    buggy = [r for r in rows if r.get("kind") == "buggy"]
    bad = [r for r in buggy if not (r.get("ok") and r.get("line_ok"))]
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in bad:
        groups[r["op"]][cause(r)].append(r)
    out = [header, ""]
    totals = Counter(r["op"] for r in buggy)
    for op in sorted(groups, key=lambda o: -sum(len(v) for v in groups[o].values())):
        n = sum(len(v) for v in groups[op].values())
        out.append(f"## {op}: {n} of {totals[op]} not right (code+culprits+line)")
        for c, rs in sorted(groups[op].items(), key=lambda kv: -len(kv[1])):
            out.append(f"- **{c}** ({len(rs)}): " + ", ".join(sorted({r['source'] for r in rs})))
            for r in rs[:2]:
                exp = r["expected"]
                got = "; ".join(f"{f['code']}@{(f.get('file') or '').rsplit('/', 1)[-1]}:{f.get('line')}"
                                f" n={f['n_parameters']}" for f in (r.get("findings") or [])[:4])
                out.append(f"  - `{r['id']}`: {exp.get('symptom')}; want {exp['codes']} at "
                           f"{exp.get('file', 'case.py')}:{exp['line']}, {len(exp['culprits'])} culprit(s) "
                           f"{exp['culprits'][:3]}; got {got or 'no finding'}")
        out.append("")
    ctrl = [r for r in rows if r.get("kind") == "control" and not r.get("ok")]
    if ctrl:
        out.append("## False errors on unmutated sources")
        for r in ctrl:
            out.append(f"- `{r['id']}`: {r.get('errors')} {r.get('error', '')}")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")
