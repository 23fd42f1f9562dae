"""check_equivalence's engine: every registered comparison, run when it applies, collected into one report.

A comparison is a module exposing `run(loaded, options) -> dict` with `applies`, `why_not`, `findings`, `verified`,
`not_run` ({"check", "why", "cause"}) and `facts`. COMPARISONS names them (name -> module path, in the order they
run): they live in this package, except storage, whose check the registration family serves too and which never
imports this one. `options["compare"]` selects some by name.
The paired comparisons of a script target (PAIRED) read what scriptmode/paired.py measured (`options["_paired"]`);
the others take the loaded target (a build_model() target, or a script's first step).
"""

from __future__ import annotations

import importlib
import traceback
from typing import Any

from gradprobe.findings import Finding
from gradprobe.report import make_report

COMPARISONS: dict[str, str] = {
    "ranks": "gradprobe.checks.equivalence.ranks",
    "accumulation": "gradprobe.checks.equivalence.accumulation",
    "custom_ops": "gradprobe.checks.equivalence.custom_ops",
    "storage": "gradprobe.checks.registration.shared_storage",
    "packing": "gradprobe.checks.equivalence.packing",
}
PAIRED = ("ranks", "accumulation")  # measured by paired runs of a script (scriptmode/paired.py reads this one)
DEFAULT_STEPS = 2


def registered() -> list[str]:
    return list(COMPARISONS)


def _run_one(name: str, loaded: Any, options: dict[str, Any]) -> dict[str, Any]:
    module = COMPARISONS[name]
    if loaded is None and name not in PAIRED:
        return {"applies": False, "why_not": "it runs on a loaded target (a build_model() target, or the script's first "
                                             "step, which did not load)", "findings": [], "verified": [], "not_run": [],
                "facts": {}}
    try:
        out: dict[str, Any] = importlib.import_module(module).run(loaded, options)
        return out
    except Exception as exc:  # ours: never the user's error
        return {"applies": True, "why_not": "", "findings": [], "verified": [], "facts": {},
                "not_run": [{"check": f"the {name} comparison", "cause": "gradprobe",
                             "why": f"gradprobe's comparison raised {type(exc).__name__}: {str(exc)[:300]}"}],
                "internal_traceback": traceback.format_exc()[-3000:]}


def equivalence_report(loaded: Any, **options: Any) -> dict[str, Any]:
    wanted = [str(c) for c in options.get("compare") or []]
    options = dict(options, steps=max(2, int(options.get("steps") or DEFAULT_STEPS)))
    findings: list[Finding] = []
    verified: list[str] = []
    not_run: list[dict[str, Any]] = []
    comparisons: dict[str, Any] = {}
    for name in COMPARISONS:
        if wanted and name not in wanted:
            comparisons[name] = {"applies": None, "why_not": "not asked (compare: " + ", ".join(wanted) + ")"}
            continue
        res = _run_one(name, loaded, options)
        findings += res.get("findings") or []
        verified += res.get("verified") or []
        not_run += res.get("not_run") or []
        comparisons[name] = {"applies": bool(res.get("applies")), "why_not": res.get("why_not") or "",
                             **({"facts": res["facts"]} if res.get("facts") else {}),
                             **({"internal_traceback": res["internal_traceback"]} if res.get("internal_traceback") else {})}
    for name in wanted:
        if name not in comparisons:
            not_run.append({"check": f"the {name} comparison", "cause": "not_applicable",
                            "why": "this build of gradprobe has no such comparison"})
    return make_report("check_equivalence", findings, _summary(comparisons, verified, not_run),
                       verified=verified, not_run=not_run, comparisons=comparisons)


def _summary(comparisons: dict[str, Any], verified: list[str], not_run: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for entry in not_run:
        if entry.get("cause") != "not_applicable":
            lines.append(f"Not run: {entry['check']}: {entry['why']}")
    ran = [n for n, c in comparisons.items() if c.get("applies")]
    skipped = [f"{n} ({c['why_not']})" for n, c in comparisons.items() if c.get("applies") is False and c.get("why_not")]
    if not ran:
        lines.append("No comparison applied to this target" + (": " + "; ".join(skipped) if skipped else "."))
    lines += [f"Verified: {v}" for v in verified]
    if ran and skipped:
        lines.append("Did not apply: " + "; ".join(skipped))
    return lines
