"""The sweep's verdicts and report (benchmarks/sweep.py): each tool's report classified on a model that trains
(an error is false, GP000/GP100/GP114-GP117 an internal crash, GP113 a resource limit, a check left out by gradprobe
itself (`not_run` with cause `gradprobe`) a gap, a warning of this round's new codes counted apart), the per-family
summary and the table, one per tool."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("built", "clean", "crash", "false_error", "missed", "resource_limit", "gap", "found", "skipped")
# Recent rounds' new codes (besides every GP6xx, GP8xx and GP9xx): a warning from one of them on a model that trains
# is counted apart.
NEW_CODES = frozenset({"GP118", "GP119", "GP120", "GP123", "GP212", "GP213", "GP315", "GP316", "GP317", "GP318", "GP319",
                       "GP703", "GP704", "GP705", "GP706", "GP707"})
CRASH_CODES = ("GP000", "GP100", "GP114", "GP115", "GP116", "GP117")


def is_new_code(code: str) -> bool:
    return code in NEW_CODES or code.startswith(("GP6", "GP8", "GP9"))


def gaps(report: dict) -> list[dict]:
    """The checks gradprobe itself left out of a report (`not_run` with cause `gradprobe`, anywhere in its facts: the
    report's own, diagnose's dependency check's, a comparison's; and diagnose's dependency check that raised): not a
    verdict on the model, and not a crash of the call, but a hole in what was verified."""
    facts = report.get("facts") or {}
    found: list[dict] = []

    def walk(node: object, where: str, depth: int) -> None:
        if depth > 4 or not isinstance(node, dict):
            return
        for entry in node.get("not_run") or []:
            if isinstance(entry, dict) and entry.get("cause") == "gradprobe":
                found.append({"check": str(entry.get("check")), "why": str(entry.get("why"))[:300], "where": where})
        for key, value in node.items():
            if key in ("not_run", "verified"):
                continue
            if isinstance(value, dict):
                walk(value, f"{where}.{key}" if where else key, depth + 1)

    walk(facts, "", 0)
    deps = facts.get("dependencies") or {}
    if isinstance(deps, dict) and deps.get("left_out"):
        found.append({"check": "dependencies (after the step)", "why": str(deps["left_out"])[:300], "where": "dependencies"})
    seen: set = set()
    return [g for g in found if (g["check"], g["why"]) not in seen and not seen.add((g["check"], g["why"]))]


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
        if f["code"] in CRASH_CODES:
            tb = (f.get("evidence") or {}).get("internal_traceback") or (f.get("evidence") or {}).get("traceback") or ""
            entry["frame"] = internal_frame(tb) if tb else "(no traceback: " + str((f.get("evidence") or {}).get("phase")) + ")"
            entry["stderr_tail"] = str((f.get("evidence") or {}).get("stderr_tail") or "")[-600:]
            crashes.append(entry)
        elif f["code"] == "GP113":
            entry["phase"] = (f.get("evidence") or {}).get("phase")
            limits.append(entry)
        elif f["severity"] == "error":
            entry["frame"] = ", ".join(raise_sites(f["code"])[:4])
            # what diagnose folded into it (one cause, one finding: a GP902 at the GP901's site)
            entry["related"] = [r.get("code") for r in (f.get("evidence") or {}).get("related", []) or []
                                if isinstance(r, dict)]
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
    deps = (report.get("facts") or {}).get("dependencies") or {}
    return {"crashes": crashes, "errors": errors, "resource_limits": limits, "warnings": dict(warnings), "infos": dict(infos),
            "new_code_warnings": new_warnings, "gaps": gaps(report),
            **({"dependency_s": deps["seconds"]} if isinstance(deps, dict) and deps.get("ran") and "seconds" in deps else {})}


STATUS_ORDER = ("crash", "false_error", "missed", "resource_limit", "gap", "found", "clean")
# the dependency codes a plain-PyTorch measurement can confirm (sweep_leaks.py): code -> what the outputs see
LEAK_CODES = {"GP901": "future", "GP902": "examples", "GP903": "packed", "GP803": "packed"}


def judge_leaks(res: dict, sees: dict | None, measures: tuple[str, ...]) -> None:
    """A GP901/GP902/GP903/GP803 error on a model whose outputs, measured in plain PyTorch on the same weights, do see
    the future (other examples, other packed examples) is a true finding (`found`), not a false error; a leak measured
    so, of a kind the tool measured (`measures`), that it did not report is `missed`."""
    if not sees:
        return
    true = [e for e in res["errors"] if sees.get(LEAK_CODES.get(e["code"], "")) is True]
    res["found"] = true
    res["errors"] = [e for e in res["errors"] if e not in true]
    reported = {LEAK_CODES[c] for e in true for c in [e["code"], *e.get("related", [])] if c in LEAK_CODES}
    res["missed"] = [{"code": "/".join(c for c, w in LEAK_CODES.items() if w == what),
                      "message": f"plain PyTorch measures that the outputs see {what} (relative change "
                                 f"{sees.get(what + '_rel', 0):.2g}); not reported"}
                     for what in dict.fromkeys(LEAK_CODES.values())
                     if what in measures and sees.get(what) is True and what not in reported]


def status_of(res: dict) -> str:
    """One bucket per model and tool: a crash, a false error, a missed leak outrank a resource limit, which outranks a
    gap (a check gradprobe left out), which outranks a true finding; none of them is clean."""
    if res["crashes"]:
        return "crash"
    if res["errors"]:
        return "false_error"
    if res.get("missed"):
        return "missed"
    if res["resource_limits"]:
        return "resource_limit"
    return "gap" if res.get("gaps") else "found" if res.get("found") else "clean"


def worst(statuses: list[str]) -> str:
    """A model's bucket over its tools: the worst of theirs."""
    return min(statuses, key=STATUS_ORDER.index) if statuses else "clean"


def _view(r: dict, tool: str | None) -> dict:
    """One model's result as one tool saw it (None: over every tool, the top-level fields)."""
    if tool is None or r["status"] == "skipped":
        return r
    return {"family": r["family"], "name": r["name"], **(r.get("tools") or {}).get(tool, {"status": "not_run"})}


def summarize(results: list[dict], skipped: list[dict], tool: str | None = None) -> dict:
    """Per family: the buckets, warnings and costs, over every tool (`tool` None) or as one tool saw each model."""
    fams: dict = {}
    for r in results + [{"family": s["family"], "name": s["name"], "status": "skipped", "skip": s["skip"]} for s in skipped]:
        f = fams.setdefault(r["family"], {**{k: 0 for k in COLUMNS}, "new_code_warning": 0, "steps_not_audited": 0,
                                           "warnings": Counter(), "infos": Counter(), "seconds": [], "ratios": [],
                                           "dependency_s": [], "dependency_share": [], "skip_reasons": Counter()})
        v = _view(r, tool)
        if v["status"] == "skipped":
            f["skipped"] += 1
            f["skip_reasons"][re.sub(r"\d+", "N", r["skip"])[:110]] += 1
            continue
        if v["status"] == "not_run":
            continue
        f["built"] += 1
        f[v["status"]] += 1
        f["new_code_warning"] += bool(v.get("new_code_warnings"))
        f["steps_not_audited"] += v.get("steps_audited") is False
        f["warnings"].update(v.get("warnings", {}))
        f["infos"].update(v.get("infos", {}))
        f["seconds"].append(v["seconds"])
        f["ratios"].append(v["ratio"])
        if "dependency_s" in v:
            f["dependency_s"].append(v["dependency_s"])
            f["dependency_share"].append(v["dependency_s"] / max(v["seconds"], 1e-9))
    out = {}
    for name, f in fams.items():
        out[name] = {k: f[k] for k in COLUMNS + ("new_code_warning", "steps_not_audited")}
        out[name]["warnings"] = dict(sorted(f["warnings"].items()))
        out[name]["infos"] = dict(sorted(f["infos"].items()))
        out[name]["median_s"] = round(statistics.median(f["seconds"]), 2) if f["seconds"] else None
        out[name]["median_ratio_to_plain_step"] = round(statistics.median(f["ratios"]), 1) if f["ratios"] else None
        out[name]["seconds"] = [round(x, 3) for x in f["seconds"]]
        out[name]["dependency_s"] = [round(x, 3) for x in f["dependency_s"]]
        out[name]["dependency_share"] = [round(x, 4) for x in f["dependency_share"]]
        out[name]["skip_reasons"] = dict(f["skip_reasons"].most_common(12))
    return out


TOTALS = COLUMNS + ("new_code_warning", "steps_not_audited")


def print_family_table(summary: dict) -> Counter:
    head = (f"{'family':<13}{'built':>6}{'clean':>6}{'crash':>6}{'false err':>10}{'missed':>7}{'gap':>5}{'found':>6}"
            f"{'res limit':>10}{'new warn':>9}{'skipped':>8}{'median s':>9}{'x plain step':>13}  warnings by code")
    print(head)
    print("-" * len(head))
    tot: Counter = Counter()
    warn_tot: Counter = Counter()
    for name, s in summary.items():
        w = " ".join(f"{k}:{v}" for k, v in s["warnings"].items()) or "-"
        median = s["median_s"] if s["median_s"] is not None else "-"
        print(f"{name:<13}{s['built']:>6}{s['clean']:>6}{s['crash']:>6}{s['false_error']:>10}{s['missed']:>7}{s['gap']:>5}"
              f"{s['found']:>6}{s['resource_limit']:>10}{s['new_code_warning']:>9}{s['skipped']:>8}{median:>9}"
              f"{s['median_ratio_to_plain_step'] or '-':>13}  {w}")
        tot.update({k: s[k] for k in TOTALS})
        warn_tot.update(s["warnings"])
    print(f"{'total':<13}{tot['built']:>6}{tot['clean']:>6}{tot['crash']:>6}{tot['false_error']:>10}{tot['missed']:>7}"
          f"{tot['gap']:>5}{tot['found']:>6}{tot['resource_limit']:>10}{tot['new_code_warning']:>9}{tot['skipped']:>8}{'':>22}  "
          f"{' '.join(f'{k}:{v}' for k, v in sorted(warn_tot.items())) or '-'}")
    return tot


def _where(e: dict) -> str:
    loc = e.get("location") or {}
    return f"{loc.get('file')}:{loc.get('line')}" if loc else "-"


# the per-model lists printed under the table: (result key, title, one entry's line)
SECTIONS = (
    ("crashes", "internal crashes", lambda e: f"{e['code']} {e['message'][:220]!r}\n      raised by {e.get('frame', '?')}"),
    ("errors", "false errors",
     lambda e: f"{e['code']} {e['message'][:220]!r}\n      at {_where(e)}; raised by {e.get('frame', '?')}"),
    ("found", "true findings (plain PyTorch measures the same leak on the same weights)",
     lambda e: f"{e['code']} {e['message'][:220]!r} at {_where(e)}"),
    ("missed", "leaks plain PyTorch measures that a dependency check that ran did not report",
     lambda e: f"{e['code']} {e['message'][:220]!r}"),
    ("gaps", "checks gradprobe left out (not_run, cause gradprobe: no verdict, a gap)",
     lambda g: f"{g['check']} ({g['where']}): {g['why'][:220]!r}"),
    ("new_code_warnings", "warnings from recent rounds' new codes",
     lambda e: f"{e['code']} {e['message'][:220]!r} at {_where(e)}"),
    ("resource_limits", "stopped at a resource limit (GP113: not a verdict on the model)",
     lambda e: f"{e['code']} in phase {e.get('phase')!r}: {e['message'][:220]!r}"),
)


def _print_problems(results: list[dict]) -> None:
    for key, title, line in SECTIONS:
        hits = [(r, e) for r in results for e in r.get(key, [])]
        if hits:
            print(f"\n{title}:")
        for r, e in hits:
            print(f"  {r['family']}/{r['name']} [{e.get('tool', '?')}]: {line(e)}")


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}" if xs else "-"


def tool_line(tool: str, summary: dict) -> str:
    """One tool's last line: its buckets over every family, and its cost per model."""
    tot: Counter = Counter()
    secs: list[float] = []
    for s in summary.values():
        tot.update({k: s[k] for k in TOTALS})
        secs += s["seconds"]
    return (f"{tool}: {tot['built']} run, {tot['clean']} clean, {tot['crash']} internal crashes, "
            f"{tot['false_error']} with false errors, {tot['found']} with true findings, {tot['missed']} with missed leaks, "
            f"{tot['gap']} with checks gradprobe left out, "
            f"{tot['new_code_warning']} with new-code warnings, {tot['resource_limit']} stopped at a resource limit; "
            f"median {_median(secs)} s / model")


def verdict_line(results: list[dict]) -> str:
    """Each tool's verdicts over the models that train (docs/verdicts.md), and how many said more than was verified
    (gradprobe.verdict.inconsistencies: an OK while a check that applies did not run)."""
    by_tool: dict[str, Counter] = {}
    wrong: Counter = Counter()
    for r in results:
        for tool, t in (r.get("tools") or {}).items():
            by_tool.setdefault(tool, Counter())[t.get("verdict") or "none"] += 1
            wrong[tool] += bool(t.get("verdict_problems"))
    parts = [f"{tool} " + ", ".join(f"{n} {status}" for status, n in sorted(c.items())) + f" ({wrong[tool]} inconsistent)"
             for tool, c in by_tool.items()]
    return "verdicts: " + "; ".join(parts)


def print_table(summary: dict, results: list[dict], wall_s: float, by_tool: dict | None = None) -> None:
    tools = list(by_tool or {})
    if len(tools) > 1:
        for tool in tools:
            print(f"\n{tool}:")
            print_family_table(by_tool[tool])  # type: ignore[index]
        print("\nover every tool (a model's worst):")
    tot = print_family_table(summary)
    _print_problems(results)
    for name, s in summary.items():
        if s["skip_reasons"]:
            print(f"\nskipped in {name}: " + "; ".join(f"{v}x {k}" for k, v in s["skip_reasons"].items()))
    print(f"\nsweep: {tot['built']} built, {tot['clean']} clean, {tot['crash']} internal crashes, "
          f"{tot['false_error']} with false errors, {tot['found']} with true findings, {tot['missed']} with missed leaks, "
          f"{tot['gap']} with checks gradprobe left out, "
          f"{tot['new_code_warning']} with new-code warnings, {tot['resource_limit']} stopped at a resource limit, "
          f"{tot['skipped']} skipped, in {wall_s / 60:.1f} min")
    for tool in tools:
        print(tool_line(tool, by_tool[tool]))  # type: ignore[index]
    deps = [x for s in (by_tool or {}).get("diagnose", {}).values() for x in s["dependency_s"]]
    share = [x for s in (by_tool or {}).get("diagnose", {}).values() for x in s.get("dependency_share", [])]
    if deps:
        print(f"diagnose's dependency check (after its step, where a claim is measured): ran on {len(deps)} models, "
              f"median {_median(deps)} s, median share of diagnose's time {_median([100 * x for x in share])} %")
    if any(r.get("tools") for r in results):
        print(verdict_line(results))
    if any(r.get("steps_audited") is not None for r in results):
        print(f"steps: the several-steps audit did not run on {tot['steps_not_audited']} of the {tot['built']} built models")
