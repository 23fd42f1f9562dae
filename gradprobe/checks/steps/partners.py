"""Whether a zero-initialised partner really moves: the measurement behind diagnose's "by design" (issue 27, item 6).

One step shows parameters whose gradient is exactly zero because a zero-initialised partner multiplies them
(LoRA's A behind B = 0, a gate that starts closed). That is by design only if the partner moves at the next
steps and the parameters then get a gradient: a partner whose gradient a callback zeroes before every
optimizer.step() never moves, and neither do they. These facts are read from the several-steps audit
(engine.py), for each partner: the step it first moved at and by how much, the first step at which the
parameters it explains got a gradient, or else what kept it still (the verdict of facts.py: its gradient
written to zero before the step, and by which line; lr 0 for its group; in no group; frozen; ...).
`checked_initialisation` turns them into the GP306 findings that settle diagnose's one-step claim (the rule and its
situations are the trace family's, checks/trace/gradient_rules.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gradprobe.checks.core.rule_text import line_of, listed
from gradprobe.checks.steps.facts import AuditFacts, OptStep
from gradprobe.checks.trace.gradient_rules import GP306
from gradprobe.findings import Finding


@dataclass
class PartnerFacts:
    """One zero-initialised partner over the audited steps, and the zero-gradient parameters it was said to explain."""

    partner: str
    params: list[str]
    steps: int  # observed calls of the step
    reason: str  # the partner's verdict over the steps (facts.py): ok, zeroed-between, lr-zero, not-in-optimizer, ...
    moved_at: int | None = None  # first call (0-based) at which the partner changed
    moved_by: float | None = None  # its update norm at that call (None: moved outside the optimizer)
    grad_at: int | None = None  # first call at which the parameters' gradient after backward() was finite and non-zero
    grad_norm: float | None = None
    location: dict | None = None  # the user's line that keeps the partner still, when one was measured
    op: str = ""  # zeroed-between: the call that wrote its gradient
    grad_before: float | None = None  # zeroed-between: its gradient's norm after backward() ...
    grad_after: float | None = None  # ... and when optimizer.step() ran (None: set to None)
    lrs: list[float] | None = None  # lr-zero: its group's lr at each step

    @property
    def verified(self) -> bool:
        """The partner moved and the parameters it multiplies then got a gradient: the initialisation explained it."""
        return self.moved_at is not None and self.grad_at is not None


def _grad_after(step: OptStep, pid: int) -> float | None:
    ps = step.params.get(pid)
    return ps.grad_after_backward if ps is not None else step.others.get(pid)


def _moved(audit: AuditFacts, pid: int, out: PartnerFacts) -> None:
    for s in audit.opt_steps:
        ps = s.params.get(pid)
        if ps is not None and ps.moved:
            out.moved_at, out.moved_by = s.call, ps.update
            return
    outside = audit.outside_moves.get(pid) or []
    out.moved_at = next((k for k, m in enumerate(outside) if m), None)


def _got_gradient(audit: AuditFacts, qids: list[int], out: PartnerFacts) -> None:
    for s in audit.opt_steps:
        values = [v for q in qids if (v := _grad_after(s, q)) is not None and math.isfinite(v)]
        total = math.sqrt(sum(v * v for v in values))
        if total > 0:
            out.grad_at, out.grad_norm = s.call, total
            return


def _what_stops(audit: AuditFacts, pid: int, out: PartnerFacts) -> None:
    """The line (and the measurement) that keeps the partner still, for the reasons the audit can place."""
    if out.reason == "zeroed-between":
        change = next((c for s in audit.opt_steps for c in s.changes if c.param == pid and not c.after), None)
        if change is not None:
            out.location, out.op, out.grad_before, out.grad_after = change.location, change.op, change.before, change.after
    elif out.reason == "lr-zero":
        steps = [s for s in audit.opt_steps if pid in s.params]
        out.lrs = [g.lr for s in steps for g in s.groups if pid in g.params]
        opt = steps[0].optimizer if steps else audit.initial_optimizer
        out.location = audit.schedule_sites.get(opt) if opt is not None else None
        out.location = out.location or audit.optimizer_site
    elif out.reason in ("not-in-optimizer", "outside-optimizer-no-grad"):
        out.location = audit.optimizer_site


def partner_facts(audit: AuditFacts, claims: dict[str, str]) -> list[PartnerFacts]:
    """`claims`: zero-gradient parameter name -> the zero-initialised partner said to explain it (diagnose's GP306)."""
    ids = {name: pid for pid, name in audit.names.items()}
    by_partner: dict[str, list[str]] = {}
    for param, partner in claims.items():
        by_partner.setdefault(partner, []).append(param)
    out: list[PartnerFacts] = []
    for partner, params in by_partner.items():
        pid = ids.get(partner)
        verdict = audit.verdicts.get(pid) if pid is not None else None
        if pid is None or verdict is None:
            continue
        facts = PartnerFacts(partner=partner, params=sorted(params), steps=audit.calls, reason=verdict.reason)
        _moved(audit, pid, facts)
        _got_gradient(audit, [ids[p] for p in params if p in ids], facts)
        if facts.moved_at is None:
            _what_stops(audit, pid, facts)
        out.append(facts)
    return out


# the partner's verdict over the steps (checks/steps/facts.py) -> the situation that says what kept it still
_STOPPED_BY = {"zeroed-between": "partner_zeroed", "lr-zero": "partner_lr_zero", "not-in-optimizer": "partner_not_in_optimizer"}
_STUCK = {
    "frozen": "it was frozen (requires_grad=False) when the steps ran",
    "nonfinite": "its gradient was inf or nan when optimizer.step() ran",
    "no-grad": "it got no gradient at any of the steps",
    "zero-grad": "its gradient was exactly zero at every step",
    "zeroed-between": "its gradient was written to zero between backward() and optimizer.step()",
    "outside-optimizer-no-grad": "it is in no parameter group of the optimizer and got no gradient at the next steps",
    "not-moved": "it had a finite non-zero gradient and a non-zero learning rate, and optimizer.step() still left it "
                 "unchanged",
}
MAX_MEASURED = 3  # partners whose measurements the checked finding spells out


def _measured(checks: list[PartnerFacts]) -> str:
    parts = []
    for c in checks[:MAX_MEASURED]:
        by = f" (update norm {c.moved_by:.3g})" if c.moved_by is not None else " (outside the optimizer)"
        parts.append(f"{c.partner} moved at step {(c.moved_at or 0) + 1}{by} and the parameters it multiplies had a "
                     f"gradient of norm {c.grad_norm or 0.0:.3g} at step {(c.grad_at or 0) + 1}")
    more = len(checks) - MAX_MEASURED
    return "; ".join(parts) + (f"; {more} more partner(s) likewise" if more > 0 else "")


def _situation(c: PartnerFacts) -> str:
    situation = _STOPPED_BY.get(c.reason, "partner_stuck")
    if situation == "partner_zeroed" and not c.op and c.location is None:
        return "partner_stuck"  # the write was not seen: say what was measured, without a line
    return situation


def _stuck_finding(group: list[PartnerFacts]) -> Finding:
    """Partners that never moved for the same measured reason at the same line: what kept them still, at that line."""
    c = group[0]
    situation = _situation(c)
    params = [p for g in group for p in g.params]
    partners = sorted(g.partner for g in group)
    evidence: dict[str, Any] = {"zero_initialised_partners": {p: g.partner for g in group for p in g.params},
                                "steps": c.steps, "partner_verdict": c.reason, "partners_moved": False}
    fields: dict[str, Any] = {}
    if situation == "partner_zeroed":
        evidence.update(grad_norm_after_backward=c.grad_before, grad_at_step=c.grad_after, op=c.op)
        fields = {"before": c.grad_before or 0.0, "after": "None" if c.grad_after is None else "zero",
                  "op": f"`{c.op}`" if c.op else "the call"}
    elif situation == "partner_lr_zero":
        evidence["lr_as_applied"] = c.lrs
        fields = {"lrs": "0 at each step" if c.lrs else "0"}
    return GP306.finding(situation, parameters=params, location=c.location, evidence=evidence, count=len(params),
                         names=listed(params, 6), partners=listed(partners, 3), steps=c.steps,
                         line=line_of(c.location) if c.location else "a line outside the project",
                         reason=_STUCK.get(c.reason, c.reason), **fields)


def checked_initialisation(claim: Finding, checks: list[PartnerFacts]) -> list[Finding]:
    """diagnose's GP306 `initialisation` claim, settled by real optimizer steps (partner_facts above): info with
    the measurements where every partner moved and the parameters then got a gradient; otherwise, for the partners
    that did not, a finding that says what kept them still, at that line (and never that it is by design)."""
    out: list[Finding] = []
    claimed: dict[str, str] = claim["evidence"].get("zero_initialised_partners") or {}
    checked = {p for c in checks for p in c.params}
    left = {p: q for p, q in claimed.items() if p not in checked}  # partners the steps could not find: as claimed
    if left:
        out.append(GP306.finding("initialisation", parameters=list(left), evidence={"zero_initialised_partners": left},
                                 count=len(left), partners=listed(sorted(set(left.values())), 3)))
    ok = [c for c in checks if c.verified]
    if ok:
        params = [p for c in ok for p in c.params]
        out.append(GP306.finding("initialisation_checked", parameters=params,
                                 evidence={"zero_initialised_partners": {p: c.partner for c in ok for p in c.params},
                                           "checked_over_steps": ok[0].steps,
                                           "partners_moved": {c.partner: {"step": (c.moved_at or 0) + 1,
                                                                          "update_norm": c.moved_by} for c in ok},
                                           "gradient_after": {c.partner: {"step": (c.grad_at or 0) + 1,
                                                                          "grad_norm": c.grad_norm} for c in ok}},
                                 count=len(params), partners=listed(sorted(c.partner for c in ok), 3),
                                 steps=ok[0].steps, measured=_measured(ok)))
    stuck: dict[tuple[str, Any, Any, str], list[PartnerFacts]] = {}
    for c in checks:
        if c.verified:
            continue
        if c.moved_at is not None:
            out.append(GP306.finding("partner_moved_still_zero", parameters=c.params,
                                     evidence={"zero_initialised_partner": c.partner, "steps": c.steps,
                                               "partner_moved_at_step": c.moved_at + 1},
                                     count=len(c.params), names=listed(c.params, 6), partners=c.partner, steps=c.steps))
            continue
        where = c.location or {}
        stuck.setdefault((_situation(c), where.get("file"), where.get("line"), c.reason), []).append(c)
    return out + [_stuck_finding(group) for group in stuck.values()]
