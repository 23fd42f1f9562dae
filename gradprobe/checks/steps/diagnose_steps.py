"""`diagnose` with `steps` > 0: after diagnose's one observed step, the several-steps audit runs on the same load,
and its findings and measurements join diagnose's report.

What the steps measured also settles two of diagnose's own findings:
- parameters outside every optimizer that still require grad (GP201 param-not-in-optimizer) are an EMA copy by design
  when an EMA-like update moved each of them at every observed step (a mean teacher, a BYOL/DINO target left with
  requires_grad=True); GP201 is then not raised for them, and the summary says what was measured instead;
- a zero gradient that a zero-initialised partner explains (GP306 `initialisation`, LoRA's A behind B = 0) is by
  design only if the partner moves and the parameters then get a gradient. That claim is checked over real steps
  (issue 27, item 6): these steps when `steps` > 0, else CHECK_STEPS more, run after every other check and only when
  the claim is made. The finding keeps its info with the measurements, or says what kept the partner still, at
  that line (its gradient zeroed before the step, lr 0, in no group, ...).
"""

from __future__ import annotations

from typing import Any

from gradprobe.checks.optimizer.engine import GP201
from gradprobe.checks.steps.engine import audit_run
from gradprobe.checks.steps.facts import AuditFacts
from gradprobe.checks.steps.partners import checked_initialisation, partner_facts
from gradprobe.checks.steps.per_tensor import table_lines
from gradprobe.checks.trace.gradient_rules import GP306
from gradprobe.findings import Finding
from gradprobe.verdict import add_not_run, add_verified, summary_body

MAX_VERIFIED = 8
_OWNER_CODES = ("GP212", "GP213")  # several optimizers over the steps (steps/optimizer_owners.py): the audit's too
CHECK_STEPS = 3  # optimizer steps that check a zero-initialised partner moves, when diagnose runs no steps of its own


def _is_script(loaded: Any) -> bool:
    return isinstance(getattr(loaded, "info", None), dict) and "script_step" in loaded.info


def _claims(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f["code"] == GP306.code and f["severity"] == "info"
            and "zero_initialised_partners" in f["evidence"] and "checked_over_steps" not in f["evidence"]]


def check_by_design(loaded: Any, findings: list[Finding], facts: dict[str, Any],
                    audit: AuditFacts | None = None) -> list[Finding]:
    """Settle GP306's "zero-initialised partner" claims over real optimizer steps: `audit`'s, or CHECK_STEPS run now
    (after every other check, so that none of them reads the state these steps leave)."""
    claims = _claims(findings)
    if not claims or _is_script(loaded):  # a script is never replayed: its one-step info says how to check it
        return findings
    if audit is None:
        if loaded.train_step is None and loaded.optimizer is None:
            return findings  # nothing steps the partner: the one-step info stays
        try:
            _, audit = audit_run(loaded, CHECK_STEPS)
        except Exception as exc:  # a measurement of gradprobe's that fails is left out and named, never the report
            facts["zero_init_checked"] = {"left_out": f"{type(exc).__name__}: {exc}"[:300]}
            add_not_run(facts, "the check over steps that a zero-initialised partner moves (GP306)",
                        facts["zero_init_checked"]["left_out"], "gradprobe")
            return findings
    if audit is None:
        return findings
    out = [f for f in findings if not any(f is c for c in claims)]
    checked = []
    for claim in claims:
        checks = partner_facts(audit, claim["evidence"]["zero_initialised_partners"])
        if audit.step_error and not all(c.verified for c in checks):
            out.append(claim)  # the steps raised before the partner could move: nothing settled
            continue
        out += checked_initialisation(claim, checks)
        checked += [{"partner": c.partner, "parameters": c.params, "verdict": c.reason, "verified": c.verified,
                     "moved_at_step": None if c.moved_at is None else c.moved_at + 1, "update_norm": c.moved_by,
                     "gradient_at_step": None if c.grad_at is None else c.grad_at + 1, "grad_norm": c.grad_norm}
                    for c in checks]
    facts["zero_init_checked"] = {"steps": audit.calls, "partners": checked}
    if "steps" not in facts.get("checks", ["steps"]):
        facts["checks"].append("zero-init partners over steps")
    return out
# per_parameter too: a finding about tensors that do not train is judged beside what the steps measured of each
STEPS_FACTS = ("steps", "mode", "headline", "verdicts", "per_parameter", "param_groups", "per_tensor_steps", "optimizer_steps",
               "order", "ema_copies", "grad_scaler", "full_batch", "verified", "step_error", "script_step")


def ema_moved(audit_facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Parameter name -> its EMA copy row, for copies outside the optimizer moved at every observed step."""
    copies = [c for c in audit_facts.get("ema_copies") or [] if c.get("moved_per_step") and all(c["moved_per_step"])]
    out: dict[str, dict[str, Any]] = {}
    for row in audit_facts.get("per_parameter") or []:
        if row.get("in_optimizer") or not row.get("moved_outside_optimizer"):
            continue
        copy = next((c for c in copies if row["name"].startswith(c["copy"] + ".")), None)
        if copy is not None:
            out[row["name"]] = copy
    return out


def _kept_span(copy: dict[str, Any]) -> str:
    kept = [k for k in copy.get("kept_gap_per_step") or [] if isinstance(k, (int, float))]
    if not kept:
        return ""
    lo, hi = f"{min(kept):.3g}", f"{max(kept):.3g}"
    return f", keeping {lo if lo == hi else lo + '-' + hi} of its gap to {copy.get('of') or 'the student'} per step"


def settle_ema(findings: list[Finding], moved: dict[str, dict[str, Any]], steps: int) -> tuple[list[Finding], list[str]]:
    """Drop GP201 where every parameter it names is an EMA copy the steps saw move each time; say so."""
    kept, lines = [], []
    for f in findings:
        params = set(f["parameters"])
        if f["code"] == GP201.code and params and params <= set(moved):
            copies = {moved[p]["copy"]: moved[p] for p in params}
            for name, copy in copies.items():
                lines.append(f"{name} ({sum(1 for p in params if moved[p]['copy'] == name)} tensors) is outside the "
                             f"optimizer with requires_grad=True, and an EMA-like update moved it at each of the {steps} "
                             f"steps{_kept_span(copy)}: an EMA copy by design, not a parameter missing from the "
                             "optimizer (GP201 not raised).")
            continue
        kept.append(f)
    return kept, lines


def add_steps(loaded: Any, steps: int, findings: list[Finding], facts: dict[str, Any]) -> tuple[list[Finding], list[str]]:
    """Run the audit after diagnose's step; its findings join `findings`, its facts go in facts["steps"].

    A script is never replayed for this: its own loop was watched for the steps in the same run, before diagnose's
    checks ran on the step after them (scriptmode/audit.py), and that audit's report comes in `loaded.info`."""
    info = loaded.info if isinstance(getattr(loaded, "info", None), dict) else {}
    if "script_step" in info:
        report = info.get("steps_audit")
        if not isinstance(report, dict):  # the audit of the script's loop was left out (said in its note)
            note = str(report or "the script's own loop was not watched")
            facts["steps"] = {"note": note}
            add_not_run(facts, "the audit of the steps", note, "gradprobe" if "failed" in note else "refused")
            return findings, [f"Steps: not audited ({note})."]
        audit = None
    else:
        report, audit = audit_run(loaded, steps)
    return merge_audit(report, steps, findings, facts, loaded, audit)


def merge_audit(report: dict[str, Any], steps: int, findings: list[Finding], facts: dict[str, Any],
                loaded: Any = None, audit: AuditFacts | None = None) -> tuple[list[Finding], list[str]]:
    """An audit_training report joined to diagnose's: its GP6xx findings, its measurements in facts["steps"]."""
    audit_facts: dict[str, Any] = report.get("facts") or {}
    facts["steps"] = {k: audit_facts[k] for k in STEPS_FACTS if k in audit_facts}
    facts["checks"].append("steps")
    for e in audit_facts.get("not_run") or []:
        add_not_run(facts, str(e.get("check")), str(e.get("why")), e.get("cause", "gradprobe"), e.get("location"))
    if "headline" not in audit_facts:  # the audit did not run (script mode, no optimizer): say why
        facts["steps"]["note"] = report.get("summary", "")
        if not audit_facts.get("not_run"):
            add_not_run(facts, "the audit of the steps", summary_body(report)[-1] if summary_body(report) else "not said",
                        "refused")
        measured = [f for f in report.get("findings") or [] if f["code"].startswith("GP6")]  # a scaler that skipped all
        return findings + measured, [f"Steps: not audited ({report.get('summary', '').splitlines()[-1]})"]
    kept, lines = settle_ema(check_by_design(loaded, findings, facts, audit) if loaded is not None else findings,
                             ema_moved(audit_facts),
                             int(audit_facts.get("steps") or steps))
    kept += [f for f in report.get("findings") or [] if f["code"].startswith("GP6") or f["code"] in _OWNER_CODES]
    lines.insert(0, "Steps: " + str(audit_facts["headline"]))
    add_verified(facts, f"{audit_facts.get('steps')} step(s) watched: {audit_facts['headline']}")
    ended = (audit_facts.get("script_step") or {}).get("script_ended")
    if ended:  # a script that ended before the steps asked for (its last step is the one diagnose checked)
        lines.insert(1, f"Steps: {ended}; the steps it took were audited.")
    if audit_facts.get("clean", report.get("ok")):
        lines += ["Verified over the steps: " + v for v in (audit_facts.get("verified") or [])[1:MAX_VERIFIED + 1]]
    return kept, lines + table_lines(audit_facts.get("per_tensor_steps") or {})
