"""Comparison 4: a custom or fused op against its reference.

Every custom autograd.Function the model really calls is checked against finite differences on the inputs it really
gets (checks/gradcheck/engine.py), at the recorded weights and at the weights perturbed (gradcheck/op_states.py), with
tolerances from the dtype it computes in (gradcheck/op_precision.py): GP401-GP409. A module the user marks as the
replacement of another (`reference`) is compared with it on the same weights and recorded inputs
(gradcheck/reference.py): GP804. run_gradcheck and
diagnose run the first today; run_gradcheck's `reference` option the second; `run` is both, for check_equivalence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradprobe.checks.gradcheck.reference import reference_report

if TYPE_CHECKING:
    from gradprobe.loading import Loaded


def run(loaded: Loaded, options: dict[str, Any]) -> dict[str, Any]:
    """Comparison 4 for check_equivalence: every custom Function (recorded and perturbed weights, dtype tolerances),
    and `options["reference"]` when given."""
    from gradprobe.checks.gradcheck import engine as gradcheck

    watch, direct, error, limited = gradcheck.discover(loaded)
    findings, facts = gradcheck.gradcheck_findings(loaded, watch, direct)
    if limited is not None:
        findings.insert(0, limited)
    functions = facts["functions"]
    verified, skipped = list(facts.get("verified") or []), list(facts.get("not_run") or [])  # gradcheck_verdict's
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
