"""The sweep's verdicts and report (benchmarks/sweep.py): each diagnose report classified on a model that trains
(an error is false, GP000/GP100/GP114-GP117 an internal crash, GP113 a resource limit, a warning of this round's new
codes counted apart), the per-family summary and the table."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("built", "clean", "crash", "false_error", "resource_limit", "skipped")
# This round's new codes (besides every GP6xx): a warning from one of them on a model that trains is counted apart.
NEW_CODES = frozenset({"GP118", "GP119", "GP120", "GP123", "GP212", "GP213", "GP315", "GP316", "GP317", "GP318", "GP319",
                       "GP703", "GP704", "GP705", "GP706", "GP707"})


def is_new_code(code: str) -> bool:
    return code in NEW_CODES or code.startswith("GP6")


_RAISE_SITES: dict[str, list[str]] = {}


def raise_sites(code: str) -> list[str]:
    """The gradprobe source lines that can produce `code` (the frame that raised a finding)."""
    if not _RAISE_SITES:
        for path in sorted((ROOT / "gradprobe").rglob("*.py")):
            for i, text in enumerate(path.read_text().splitlines(), 1):
                for m in re.finditer(r'"(GP\d{3})"', text):
                    producing = text.strip().startswith(m.group(0) + ",") or f"make_finding({m.group(0)}" in text
                    mapped = re.search(r'"\w+": ' + m.group(0), text) is not None  # a kind -> code table (trace's cuts)
                    if not (producing or mapped):
                        continue  # a RULES key or a list of codes, not a producing site
                    _RAISE_SITES.setdefault(m.group(1), []).append(f"{path.relative_to(ROOT)}:{i}")
    return _RAISE_SITES.get(code, [])


def internal_frame(tb: str) -> str:
    """The innermost gradprobe frame of a traceback text."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', tb)
    ours = [f for f in frames if "/gradprobe/" in f[0]]
    if not ours:
        return frames[-1][0] + ":" + frames[-1][1] if frames else "?"
    f = ours[-1]
    inside = f[0].split('/gradprobe/', 1)[-1]
    return f"{inside and 'gradprobe/' + inside}:{f[1]} in {f[2]}: {f[3].strip()}"


def classify(report: dict) -> dict:
    """crash / errors / resource limits / warnings / infos of one diagnose report (the model trains: errors are false;
    GP113 says a memory limit stopped the check, which is no verdict on the model either way)."""
    crashes, errors, limits, new_warnings = [], [], [], []
    warnings: Counter = Counter()
    infos: Counter = Counter()
    for f in report.get("findings", []):
        entry = {"code": f["code"], "message": f["message"][:400], "location": f.get("location"),
                 "parameters": (f.get("parameters") or [])[:6]}
        if f["code"] in ("GP000", "GP100", "GP114", "GP115", "GP116", "GP117"):
            tb = (f.get("evidence") or {}).get("internal_traceback") or (f.get("evidence") or {}).get("traceback") or ""
            entry["frame"] = internal_frame(tb) if tb else "(no traceback: " + str((f.get("evidence") or {}).get("phase")) + ")"
            entry["stderr_tail"] = str((f.get("evidence") or {}).get("stderr_tail") or "")[-600:]
            crashes.append(entry)
        elif f["code"] == "GP113":
            entry["phase"] = (f.get("evidence") or {}).get("phase")
            limits.append(entry)
        elif f["severity"] == "error":
            entry["frame"] = ", ".join(raise_sites(f["code"])[:4])
            errors.append(entry)
        elif f["severity"] == "warning":
            warnings[f["code"]] += 1
            if is_new_code(f["code"]):
                new_warnings.append(entry)
        else:
            infos[f["code"]] += 1
        for rel in (f.get("evidence") or {}).get("related", []) or []:
            if isinstance(rel, dict) and rel.get("severity") == "error" and f["severity"] != "error":
                errors.append({"code": rel.get("code"), "message": str(rel.get("message"))[:400], "folded": True})
    seen: set = set()
    errors = [e for e in errors if (e["code"], e["message"]) not in seen and not seen.add((e["code"], e["message"]))]
    return {"crashes": crashes, "errors": errors, "resource_limits": limits, "warnings": dict(warnings), "infos": dict(infos),
            "new_code_warnings": new_warnings}


def status_of(res: dict) -> str:
    """One bucket per model: a crash or a false error outranks a resource limit, which is not clean."""
    if res["crashes"]:
        return "crash"
    if res["errors"]:
        return "false_error"
    return "resource_limit" if res["resource_limits"] else "clean"


def summarize(results: list[dict], skipped: list[dict]) -> dict:
    fams: dict = {}
    for r in results + [{"family": s["family"], "name": s["name"], "status": "skipped", "skip": s["skip"]} for s in skipped]:
        f = fams.setdefault(r["family"], {"built": 0, "clean": 0, "crash": 0, "false_error": 0, "resource_limit": 0, "skipped": 0,
                                           "new_code_warning": 0, "steps_not_audited": 0,
                                           "warnings": Counter(), "infos": Counter(), "seconds": [], "ratios": [],
                                           "skip_reasons": Counter()})
        if r["status"] == "skipped":
            f["skipped"] += 1
            f["skip_reasons"][re.sub(r"\d+", "N", r["skip"])[:110]] += 1
            continue
        f["built"] += 1
        f[r["status"]] += 1
        f["new_code_warning"] += bool(r.get("new_code_warnings"))
        f["steps_not_audited"] += r.get("steps_audited") is False
        f["warnings"].update(r.get("warnings", {}))
        f["infos"].update(r.get("infos", {}))
        f["seconds"].append(r["seconds"])
        f["ratios"].append(r["ratio"])
    out = {}
    for name, f in fams.items():
        out[name] = {k: f[k] for k in COLUMNS + ("new_code_warning", "steps_not_audited")}
        out[name]["warnings"] = dict(sorted(f["warnings"].items()))
        out[name]["infos"] = dict(sorted(f["infos"].items()))
        out[name]["median_s"] = round(statistics.median(f["seconds"]), 2) if f["seconds"] else None
        out[name]["median_ratio_to_plain_step"] = round(statistics.median(f["ratios"]), 1) if f["ratios"] else None
        out[name]["skip_reasons"] = dict(f["skip_reasons"].most_common(12))
    return out


def print_table(summary: dict, results: list[dict], wall_s: float) -> None:
    head = (f"{'family':<13}{'built':>6}{'clean':>6}{'crash':>6}{'false err':>10}{'res limit':>10}{'skipped':>8}{'median s':>9}"
            f"{'x plain step':>13}  warnings by code")
    print(head)
    print("-" * len(head))
    tot = Counter()
    warn_tot: Counter = Counter()
    for name, s in summary.items():
        w = " ".join(f"{k}:{v}" for k, v in s["warnings"].items()) or "-"
        print(f"{name:<13}{s['built']:>6}{s['clean']:>6}{s['crash']:>6}{s['false_error']:>10}{s['resource_limit']:>10}{s['skipped']:>8}"
              f"{s['median_s'] if s['median_s'] is not None else '-':>9}{s['median_ratio_to_plain_step'] or '-':>13}  {w}")
        tot.update({k: s[k] for k in COLUMNS + ("new_code_warning", "steps_not_audited")})
        warn_tot.update(s["warnings"])
    print(f"{'total':<13}{tot['built']:>6}{tot['clean']:>6}{tot['crash']:>6}{tot['false_error']:>10}{tot['resource_limit']:>10}{tot['skipped']:>8}"
          f"{'':>22}  {' '.join(f'{k}:{v}' for k, v in sorted(warn_tot.items())) or '-'}")
    bad = [r for r in results if r["status"] in ("crash", "false_error")]
    if bad:
        print("\ncrashes and false errors:")
    for r in bad:
        for e in r.get("crashes", []) + r.get("errors", []):
            loc = e.get("location") or {}
            where = f"{loc.get('file')}:{loc.get('line')}" if loc else "-"
            print(f"  {r['family']}/{r['name']}: {e['code']} {e['message'][:220]!r}\n"
                  f"      at {where}; raised by {e.get('frame', '?')}")
    warned = [r for r in results if r.get("new_code_warnings")]
    if warned:
        print("\nwarnings from this round's new codes:")
    for r in warned:
        for e in r["new_code_warnings"]:
            loc = e.get("location") or {}
            print(f"  {r['family']}/{r['name']}: {e['code']} {e['message'][:220]!r} at {loc.get('file')}:{loc.get('line')}")
    limited = [r for r in results if r["status"] == "resource_limit"]
    if limited:
        print("\nstopped at a resource limit (GP113: not a verdict on the model):")
    for r in limited:
        for e in r.get("resource_limits", []):
            print(f"  {r['family']}/{r['name']}: {e['code']} in phase {e.get('phase')!r}: {e['message'][:220]!r}")
    for name, s in summary.items():
        if s["skip_reasons"]:
            print(f"\nskipped in {name}: " + "; ".join(f"{v}x {k}" for k, v in s["skip_reasons"].items()))
    print(f"\nsweep: {tot['built']} built, {tot['clean']} clean, {tot['crash']} internal crashes, "
          f"{tot['false_error']} with false errors, {tot['new_code_warning']} with new-code warnings, "
          f"{tot['resource_limit']} stopped at a resource limit, "
          f"{tot['skipped']} skipped, in {wall_s / 60:.1f} min")
    if any(r.get("steps_audited") is not None for r in results):
        print(f"steps: the several-steps audit did not run on {tot['steps_not_audited']} of the {tot['built']} built models")
