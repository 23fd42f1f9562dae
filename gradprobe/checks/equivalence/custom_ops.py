"""Comparison 4: a custom or fused op against its reference.

Every custom autograd.Function the model really calls is checked against finite differences on the inputs it really
gets (checks/gradcheck/engine.py), at the recorded weights and at the weights perturbed (op_states.py), with tolerances from
the dtype it computes in (op_precision.py): GP401-GP409. A module the user marks as the replacement of another
(`reference`) is compared with it on the same weights and recorded inputs (reference.py): GP804. run_gradcheck and
diagnose run the first today; run_gradcheck's `reference` option the second; `run` is both, for check_equivalence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradprobe.checks.equivalence import reference as reference_check
from gradprobe.findings import Finding

if TYPE_CHECKING:
    from gradprobe.loading import Loaded


def verified_line(info: dict[str, Any], findings: list[Finding]) -> str | None:
    """What the check of one Function measured, when it found nothing wrong with it (None otherwise)."""
    name = info["function"]
    if "skipped" in info or any(f["severity"] != "info" and f["evidence"].get("function") == name for f in findings):
        return None
    pert = info.get("perturbed")
    at = " and at its weight-like inputs perturbed" if pert and pert.get("result") == "exact" else ""
    largest = max(info.get("largest_abs_error", 0.0), (pert or {}).get("largest_abs_error", 0.0))
    prec = info.get("precision")
    dtype = f", computing in {prec['compute_dtype']}" if prec else ""
    mode = info.get("mode", "full Jacobian")
    size = f"largest |analytical - numerical| {largest:.2g}, " if mode == "full Jacobian" else ""
    return (f"{name}: backward matches finite differences at the recorded inputs{at} ({mode}, {size}"
            f"atol {info.get('atol', 0):.2g}, rtol {info.get('rtol', 0):.2g}{dtype})")


def not_run(functions: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"check": f"gradcheck {f['function']}", "why": f["skipped"], "cause": "not_applicable"}
            for f in functions if "skipped" in f]


def reference_report(loaded: Loaded, option: Any) -> tuple[list[Finding], dict[str, Any]]:
    """The custom module against its reference (GP804): findings, and facts with verified / not_run lines."""
    facts = reference_check.measure(loaded, option)
    findings = reference_check.reference_findings(facts)
    done = [c for c in facts.comparisons]
    worst = max((c.largest for c in done), default=0.0)
    summary = (f"Reference: {len(done)} instance(s) of {option['module']} compared with {option['replaces']} "
               f"(largest relative difference {worst:.2g})" if done else
               f"Reference: {option['module']} was not compared with {option['replaces']} (see not_run)")
    return findings, {"comparisons": [{"module": c.path, "class": c.cls, "reference": c.reference, "state": c.state,
                                       "tolerance": c.tol, "dtype": c.dtype, "compared": c.compared,
                                       "largest_relative_difference": c.largest, "differs": bool(c.diffs)}
                                      for c in done],
                      "verified": reference_check.verified(facts), "not_run": facts.not_run, "summary": summary}


def run(loaded: Loaded, options: dict[str, Any]) -> dict[str, Any]:
    """Comparison 4 for check_equivalence: every custom Function (recorded and perturbed weights, dtype tolerances),
    and `options["reference"]` when given."""
    from gradprobe.checks.gradcheck import engine as gradcheck

    watch, direct, error, limited = gradcheck.discover(loaded)
    findings, facts = gradcheck.gradcheck_findings(loaded, watch, direct)
    if limited is not None:
        findings.insert(0, limited)
    functions = facts["functions"]
    verified = [line for f in functions if (line := verified_line(f, findings))]
    skipped = not_run(functions)
    if error:
        skipped.append({"check": "gradcheck", "why": f"the step raised {error}: Functions after it were not reached",
                        "cause": "user_code"})
    out_facts: dict[str, Any] = {"functions": functions}
    # check_equivalence's `reference` names the reference setup: `args` for a script's reference run (the paired
    # comparisons), `module`/`replaces` for a module that replaces another (this comparison)
    reference = options.get("reference") or {}
    option = reference if isinstance(reference, dict) and ("module" in reference or "replaces" in reference) else None
    if option is not None:
        rfindings, rfacts = reference_report(loaded, option)
        findings += rfindings
        verified += rfacts["verified"]
        skipped += rfacts["not_run"]
        out_facts["reference"] = rfacts
    applies = bool(functions or direct.hits or option is not None)
    return {"applies": applies, "why_not": "" if applies else "the model calls no custom autograd.Function of the "
            "user's and no reference was given", "findings": findings, "verified": verified, "not_run": skipped,
            "facts": out_facts}
