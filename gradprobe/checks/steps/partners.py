"""Whether a zero-initialised partner really moves: the measurement behind diagnose's "by design" (issue 27, item 6).

One step shows parameters whose gradient is exactly zero because a zero-initialised partner multiplies them
(LoRA's A behind B = 0, a gate that starts closed). That is by design only if the partner moves at the next
steps and the parameters then get a gradient: a partner whose gradient a callback zeroes before every
optimizer.step() never moves, and neither do they. These facts are read from the several-steps audit
(engine.py), for each partner: the step it first moved at and by how much, the first step at which the
parameters it explains got a gradient, or else what kept it still (the verdict of facts.py: its gradient
written to zero before the step, and by which line; lr 0 for its group; in no group; frozen; ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradprobe.checks.steps.facts import AuditFacts, OptStep


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
