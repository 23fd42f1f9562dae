"""A report never contradicts itself: assertions over one report (any tool, the JSON the server returns).

- `ok` is true exactly when the verdict is "verified" (never beside an error), and the summary's first line says the
  same (gradprobe/verdict.py's own consistency rules are checked by the examples' assertions in conftest.py);
- an error that says tensors do not train (not in the optimizer, stale, never stepped, never moved) names no tensor
  that the steps' own table (per_parameter) says was in the optimizer, had a gradient at the step and moved;
- a GP202 (the optimizer holds tensors that are not the model's) never stands beside steps in which every tensor
  the optimizers hold is a parameter of the audited model (the issue-41 report: "64 of 64 ... moved" and GP202 about
  16 tensors that were in fact the text encoder's);
- a parameter is named one way throughout: every name an optimizer finding gives is a name of the report's own
  tables (the traced step's and the steps'), when the report has those tables whole.
"""

from __future__ import annotations

from typing import Any

# errors that say the tensors they name do not train
NOT_TRAINED = ("GP201", "GP202", "GP207", "GP213", "GP606")
# findings whose parameters are the model's own parameter names
NAMED = ("GP201", "GP202", "GP207", "GP210", "GP212", "GP213", "GP606")
MAX_ROWS = 300  # checks/steps/summary.py: the per-parameter table is cut there


def _steps(report: dict[str, Any]) -> dict[str, Any]:
    facts = report.get("facts") or {}
    return facts.get("steps") if isinstance(facts.get("steps"), dict) else facts if "headline" in facts else {}


def contradictions(report: dict[str, Any]) -> list[str]:
    """Every way `report` contradicts itself, as sentences (none: consistent)."""
    out: list[str] = []
    findings = report.get("findings") or []
    errors = [f for f in findings if f["severity"] == "error"]
    status = (report.get("verdict") or {}).get("status")
    if bool(report.get("ok")) != (status == "verified") or (report.get("ok") and errors):
        out.append(f"ok={report.get('ok')} beside {len(errors)} error(s) and the verdict {status!r}")
    first = (report.get("summary") or "").splitlines()[:1]
    if first and first[0].startswith(("No error found", "verified")) and errors:
        out.append(f"the summary says {first[0]!r} beside errors {[f['code'] for f in errors]}")
    steps = _steps(report)
    rows = {r["name"]: r for r in steps.get("per_parameter") or []}
    for f in errors:
        if f["code"] not in NOT_TRAINED:
            continue
        fine = [n for n in f["parameters"] if rows.get(n, {}).get("verdict") == "ok"]
        if fine:
            out.append(f"{f['code']} says {fine[:3]} do not train, the steps say they trained (verdict ok)")
    out += _stale(errors, steps, rows)
    out += _names(report, findings, rows)
    return out


def _stale(errors: list[dict[str, Any]], steps: dict[str, Any], rows: dict[str, Any]) -> list[str]:
    """GP202 beside steps that measured the tensors it calls stale: a tensor no live module holds is in no forward, so
    it never gets a gradient."""
    groups = steps.get("param_groups") or []
    out = []
    for f in (f for f in errors if f["code"] == "GP202"):
        stale = len(f["evidence"].get("stale_tensors") or []) or 1
        held = sum(g["tensors"] for g in groups)
        fed = [max(g.get("with_gradient_at_step") or [0]) for g in groups]
        if groups and sum(fed) > held - stale:
            out.append(f"GP202 says {stale} of the {held} tensors the optimizers hold are stale (no live module holds "
                       f"them), but {sum(fed)} of them had a gradient at the steps")
        in_model = sum(1 for r in rows.values() if r.get("in_optimizer"))
        if groups and 0 < len(rows) < MAX_ROWS and held == in_model:
            out.append(f"GP202 says the optimizer holds tensors that are not the model's, but all {held} tensors the "
                       "optimizers stepped are parameters of the audited model")
    return out


def _names(report: dict[str, Any], findings: list[dict[str, Any]], rows: dict[str, Any]) -> list[str]:
    traced = {r["name"] for r in (report.get("facts") or {}).get("per_parameter") or [] if "grad" in r}
    if not rows or len(rows) >= MAX_ROWS:
        return []
    known = set(rows) | traced
    out = []
    for f in findings:
        if f["code"] not in NAMED:
            continue
        odd = [n for n in f["parameters"] if n.removesuffix(" (its copy)") not in known and not n.startswith("<")]
        if odd:
            out.append(f"{f['code']} names {odd[:3]}, which no table of the report names (one tensor, two names?)")
    return out


def assert_consistent(report: dict[str, Any], name: str = "") -> None:
    found = contradictions(report)
    assert not found, f"{name}: the report contradicts itself: {found}"
