"""audit_training's report text and facts: the per-parameter headline, per-group numbers, and the measured all-clear."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from gradprobe.checks.steps.accumulation import mass_text
from gradprobe.checks.steps.facts import AuditFacts, EmaCopy, GroupStep, at, listed
from gradprobe.checks.steps.gradients import one_loss_in_parts
from gradprobe.checks.steps.per_tensor import per_tensor_steps, table_lines
from gradprobe.checks.steps.schedule import schedule_lines
from gradprobe.findings import Finding

MAX_ROWS = 300


def _span(values: list[float]) -> str:
    vs = [v for v in values if v is not None]
    if not vs:
        return "-"
    lo, hi = f"{min(vs):.3g}", f"{max(vs):.3g}"
    return lo if lo == hi else f"{lo}-{hi}"


def _groups(facts: AuditFacts) -> dict[tuple[int, int], list[GroupStep]]:
    out: dict[tuple[int, int], list[GroupStep]] = {}
    for s in facts.opt_steps:
        for g in s.groups:
            out.setdefault((s.optimizer, g.index), []).append(g)
    return out


def _with_gradient(facts: AuditFacts, opt: int) -> dict[int, list[int]]:
    """id(GroupStep) -> ... per step of `opt`: how many of the group's tensors had a finite non-zero gradient at it."""
    out: dict[int, list[int]] = {}
    for s in facts.opt_steps:
        if s.optimizer == opt:
            for g in s.groups:
                grads = (s.params[p].grad_at_step for p in g.params if p in s.params)
                out[id(g)] = [sum(1 for v in grads if v is not None and math.isfinite(v) and v > 0)]
    return out


def group_rows(facts: AuditFacts) -> list[dict[str, Any]]:
    rows = []
    opts = list(dict.fromkeys(o for o, _ in _groups(facts)))
    counts: dict[int, list[int]] = {}
    for o in opts:
        counts.update(_with_gradient(facts, o))
    for (opt, index), seen in _groups(facts).items():
        rows.append({"optimizer": opts.index(opt), "group": index,
                     "tensors": len(seen[0].params), "lr_as_applied": [g.lr for g in seen],
                     "with_gradient_at_step": [counts.get(id(g), [0])[0] for g in seen],
                     "grad_norm_after_backward": [g.grad_after_backward for g in seen],
                     "grad_norm_at_step": [g.grad_at_step for g in seen], "update_norm": [g.update for g in seen],
                     "weight_norm": [g.weight for g in seen], "update_ratio": [g.ratio for g in seen]})
    return rows


def idle_models(facts: AuditFacts) -> dict[str, int]:
    """Several models: those beside the trained ones that no optimizer holds and no backward reached over the steps
    (a teacher used under no_grad as the target), with their trainable tensors: frozen by design."""
    by_member: dict[str, list[str]] = {}
    for v in facts.verdicts.values():
        head = v.name.split(".", 1)[0]
        if head in facts.members and v.requires_grad:
            by_member.setdefault(head, []).append(v.reason)
    return {m: len(rs) for m, rs in by_member.items() if all(r == "outside-optimizer-no-grad" for r in rs)}


def headline(facts: AuditFacts) -> str:
    ema = [v for v in facts.verdicts.values() if v.requires_grad and not v.in_optimizer and v.moved_outside]
    idle = idle_models(facts)
    trainable = [v for v in facts.verdicts.values() if v.requires_grad and v not in ema
                 and v.name.split(".", 1)[0] not in idle]
    good = [v for v in trainable if v.in_optimizer and v.grad_at_step and v.moved_by_step]
    beside = "; ".join(f"{m} ({n} tensors with requires_grad) is in no optimizer and no backward() reached it: frozen "
                       "beside the trained models" for m, n in idle.items())
    return (f"Over {facts.calls} step(s) ({len(facts.opt_steps)} optimizer step(s)): {len(good)} of {len(trainable)} "
            "trainable parameter tensors are in the optimizer, had a finite non-zero gradient when optimizer.step() ran, "
            "and moved" + (f"; {len(ema)} more, outside the optimizer, were moved by an EMA-like update" if ema else "")
            + (f"; {beside}" if beside else "") + ".")


def _ema_line(copy: EmaCopy) -> str:
    """An EMA copy's movement against what an EMA predicts: t1 - s1 = decay * (t0 - s1), so the share of its gap to the
    student it keeps is its decay, the same at every step (after a first update that copied the model outright, as
    torch's AveragedModel's and diffusers' EMAModel's first updates do)."""
    name = (f"held outside the model (written at {at(copy.site)}), of {copy.student or 'the model'}" if copy.held_outside
            else f"{copy.prefix} of {copy.student or 'the model'}")
    text = (f"EMA copy {name} ({len(copy.params)} tensors) moved at "
            f"{sum(copy.moved)} of {len(copy.moved)} steps; it kept {_span(copy.kept)} of its gap to the student per step")
    first_copy = len(copy.kept) > 2 and copy.kept[0] < 1e-6  # float32: a full copy keeps ~1e-8
    kept = copy.kept[1:] if first_copy else copy.kept
    if kept and max(kept) - min(kept) <= 1e-3 * max(abs(max(kept)), 1e-12):
        return text + (", the first update a full copy of the model, then" if first_copy else ",") + \
            f" the same share at every step: an EMA update with decay {sum(kept) / len(kept):.4g}, as that decay predicts"
    return text + " (an EMA with a fixed decay keeps the same share at every step; a scheduled decay, its value at each)"


def verified(facts: AuditFacts, measured: list[str] | None = None) -> list[str]:
    """What the steps measured, as numbers a reader can check without reading the code."""
    out = []
    for row in group_rows(facts):
        out.append(f"group {row['group']} ({row['tensors']} tensors): lr as applied {_span(row['lr_as_applied'])}, "
                   f"grad norm at step {_span(row['grad_norm_at_step'])}, update/weight {_span(row['update_ratio'])}")
    changed = [c for s in facts.opt_steps for c in s.changes]
    if changed:
        ratios = [c.after / c.before for c in changed if c.after and c.before]
        out.append(f"gradients changed between backward() and step() (unscale_, clipping or hooks) by a factor {_span(ratios)}, "
                   "never to zero")
    else:
        out.append("no gradient changed between backward() and optimizer.step()")
    multi = [s for s in facts.opt_steps if len(s.backwards) > 1]
    if multi:
        s = multi[0]
        k, line = len(s.backwards), at(s.backwards[0].location)
        if one_loss_in_parts(s):
            out.append(f"{k} backward() calls per optimizer step from {line}, each backpropagating the same loss value "
                       f"({s.backwards[0].value:.6g}) through a different part of the batch: the gradient of one loss over "
                       f"the whole batch computed in parts (cached features), so no division by {k} is needed "
                       "(check_equivalence compares the step with one batch, tensor by tensor)")
        else:
            out.append(f"{k} backward() calls per optimizer step from {line}, each loss scaled ({s.backwards[0].top})"
                       + (mass_text(s, facts.scaler_steps) if facts.full_batch is None else ""))
    out += measured or []
    frozen = [v for v in facts.verdicts.values() if not v.requires_grad]
    if frozen:
        moved = [v for v in frozen if v.moved_outside]
        also = f"; {len(moved)} frozen tensor(s) changed outside the optimizer (EMA-like updates)" if moved else ""
        out.append(f"{len(frozen) - len(moved)} frozen tensor(s) unchanged over the steps" + also)
    out += [_ema_line(copy) for copy in facts.ema if any(copy.moved)]
    if facts.scaler_steps:
        skipped = sum(s.skipped for s in facts.scaler_steps)
        out.append(f"GradScaler: scale {_span([s.scale for s in facts.scaler_steps if s.scale is not None])}, "
                   f"{skipped} of {len(facts.scaler_steps)} optimizer steps skipped for inf/nan gradients")
    out += schedule_lines(facts)
    counts = [s.state_step for s in facts.opt_steps if s.state_step is not None]
    if counts:
        out.append(f"optimizer state step count {_span(counts)} over the steps (never reset)")
    return out


def summary_lines(facts: AuditFacts, findings: list[Finding], measured: list[str] | None = None) -> list[str]:
    lines = [headline(facts)]
    if not facts.opt_steps and not facts.step_error:
        lines.append("No optimizer.step() ran in the observed steps: nothing was updated"
                     + (" (the GradScaler skipped every step: the scaled gradients were inf or nan)."
                        if facts.scaler_steps else "."))
    if not any(f["severity"] in ("error", "warning") for f in findings):
        lines += ["Verified: " + v for v in verified(facts, measured)]
    return lines + table_lines(per_tensor_steps(facts))


def _param_rows(facts: AuditFacts) -> list[dict[str, Any]]:
    rows = []
    for v in list(facts.verdicts.values())[:MAX_ROWS]:
        rows.append({"name": v.name, "requires_grad": v.requires_grad, "in_optimizer": v.in_optimizer,
                     "grad_at_step": "nonfinite" if v.nonfinite else "ok" if v.grad_at_step else "none-or-zero",
                     "moved_by_step": v.moved_by_step, "moved_outside_optimizer": v.moved_outside, "verdict": v.reason})
    return rows


def facts_table(facts: AuditFacts, findings: list[Finding], measured: list[str] | None = None) -> dict[str, Any]:
    ok = not any(f["severity"] in ("error", "warning") for f in findings)
    moved_outside = [v.name for v in facts.verdicts.values() if v.moved_outside]
    return {
        "steps": facts.calls, "mode": facts.mode, "headline": headline(facts),
        "verdicts": dict(Counter(v.reason for v in facts.verdicts.values())),
        "per_parameter": _param_rows(facts), "param_groups": group_rows(facts), "per_tensor_steps": per_tensor_steps(facts),
        "optimizer_steps": [{"step": s.call + 1, "at": at(s.location), "backward_calls": len(s.backwards),
                             "backward_lines": sorted({at(b.location) for b in s.backwards}),
                             "loss_last_op": [b.top for b in s.backwards], "state_step": s.state_step}
                            for s in facts.opt_steps[:64]],
        "order": [{"step": e.call + 1, "event": e.kind, "at": at(e.location)} for e in facts.events[:120]],
        "changed_between_backward_and_step": [
            {"step": s.call + 1, "parameter": facts.name(c.param), "before": c.before, "after": c.after,
             "by": at(c.location), "op": c.op, "writes": c.writers[:8]}
            for s in facts.opt_steps for c in s.changes][:MAX_ROWS],
        "moved_outside_optimizer": listed(moved_outside, 20) if moved_outside else "",
        "ema_copies": [{"copy": c.prefix, "of": c.student, "tensors": len(c.params), "moved_per_step": c.moved,
                        "kept_gap_per_step": c.kept, "held": "outside the model" if c.held_outside else "in the model",
                        "written_at": at(c.site) if c.held_outside else None} for c in facts.ema],
        "autograd_grad_calls": [{"step": g.call + 1, "at": at(g.location), "create_graph": g.create_graph,
                                 "inputs_are_parameters": g.inputs_are_parameters, "used_in_backward": g.used_in_backward}
                                for g in facts.grad_calls[:64]],
        "optimizers_built_during_steps": [{"step": b.call + 1, "at": at(b.location)} for b in facts.built if b.call >= 0],
        "attached_during_steps": [{"step": a.call + 1, "at": at(a.location), "tensors": len(a.params)}
                                  for a in facts.attached if a.call >= 0][:64],
        "grad_scaler": [{"step": s.call + 1, "at": at(s.location), "scale": s.scale, "skipped": s.skipped}
                        for s in facts.scaler_steps[:64]],
        # what was measured, whatever the findings (the verdict's facts.verified: gradprobe/verdict.py)
        "verified": [f"{facts.calls} step(s) watched: {headline(facts)}", *verified(facts, measured)] if facts.opt_steps else [],
        "clean": ok,
        "step_error": facts.step_error,
    }
