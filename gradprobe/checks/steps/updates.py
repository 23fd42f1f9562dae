"""GP6xx rules about what the optimizer steps did over several steps: learning rates, scheduler order, parameters
that never move, optimizers rebuilt, EMA copies."""

from __future__ import annotations

from collections.abc import Iterator

from gradprobe.checks.steps.copies import constant_share
from gradprobe.checks.steps.facts import AuditFacts, EmaCopy, at, listed
from gradprobe.findings import Finding, Rule, Situation

GP603: Rule[AuditFacts] = Rule(
    code="GP603", name="lr-zero-every-step", severity="error", rank=44,
    summary="A parameter group's learning rate, as applied by optimizer.step(), was 0 at every observed step.",
    why="A warm-up that starts at 0 and is stepped per epoch, an integer division in a schedule's lambda, or a group "
        "built with lr=0: the group's parameters get gradients but never move, and nothing raises.",
    example="LambdaLR(opt, lambda step: step // warmup_steps)   # 0 for the first warmup_steps steps",
    message="Group {group} ({count} tensor(s): {names}) had lr 0 when optimizer.step() ran at each of the {steps} observed "
            "step(s){sched}, while its parameters had gradients: they did not move.",
    fix="Give group {group} a positive learning rate where it is set ({line}).",
    situations={
        "scheduled": Situation(
            when="a learning-rate scheduler drives the optimizer",
            fix="Check the schedule at {line}: a warm-up should start above 0 (e.g. LinearLR with "
                "start_factor>0, or a lambda of (step + 1) / warmup with float division) and be stepped per batch "
                "when it is counted in batches."),
    },
)

GP604: Rule[AuditFacts] = Rule(
    code="GP604", name="scheduler-before-optimizer", severity="warning", rank=45,
    summary="scheduler.step() is called before the first optimizer.step(): the schedule's first value is skipped.",
    why="Since PyTorch 1.1 the scheduler must step after the optimizer; stepping it first advances the schedule before "
        "any update used it (a warm-up loses its first step, a step decay comes one step early).",
    example="scheduler.step(); optimizer.step()",
    message="scheduler.step() at {line} ran before the first optimizer.step() ({step_line}) of the optimizer it drives; "
            "the order seen: {order}.",
    fix="Call scheduler.step() after optimizer.step() ({step_line}), once per step (or per epoch, as the schedule is "
        "counted).",
)

GP606: Rule[AuditFacts] = Rule(
    code="GP606", name="parameter-never-moves", severity="error", rank=46,
    summary="A trainable parameter did not move in any of the observed steps, for the reason measured.",
    why="Over several real steps every trainable parameter should be in the optimizer, have a finite non-zero gradient "
        "when optimizer.step() runs, and change. One that does not, silently stays at its initial value.",
    example="model.head = nn.Linear(16, 2)   # attached after the optimizer was built: it gets gradients, never updates",
    message="{count} trainable parameter(s) ({names}) never moved over {steps} step(s): {reason}.",
    fix="Find why the step does not change them: the optimizer's state or the weights may be restored after the step.",
    situations={
        "not_in_optimizer": Situation(
            when="the parameter gets gradients but is in no parameter group",
            fix="Build the optimizer after the model is complete, or add the parameters: "
                "`optimizer.add_param_group({{'params': module.parameters()}})`."),
        "attached": Situation(
            when="the parameter was attached to the model during the steps, after the optimizer was built",
            fix="Create this module in the model's constructor (before the optimizer is built) instead of at {line}, or "
                "add its parameters to the optimizer where it is attached: "
                "`optimizer.add_param_group({{'params': module.parameters()}})`."),
        "nonfinite": Situation(
            when="the gradient at step time is inf or nan",
            fix="Find where the loss or gradient becomes non-finite (a log of 0, a division by 0, an overflow in half "
                "precision), or clip/skip such steps explicitly."),
        "no_grad": Situation(
            when="the parameter is in the optimizer but never got a gradient",
            severity="info",
            fix="If it should train, run trace_grad_path to find what cuts it from the loss; an unused head or pooler "
                "can also be frozen or removed."),
    },
)

GP607: Rule[AuditFacts] = Rule(
    code="GP607", name="optimizer-state-lost", severity="error", rank=47,
    summary="The optimizer is rebuilt (or its state emptied) during training, so momentum and Adam's moments restart.",
    why="An optimizer built inside the training step or each epoch starts with empty state every time: Adam takes its "
        "bias-corrected first steps again and again (each update about lr in size, whatever the gradient), momentum "
        "never builds up, and a scheduler attached to the old object no longer drives anything.",
    example="def train_step(model, batch, _):\n    opt = torch.optim.Adam(model.parameters())   # a new optimizer each step",
    message="An optimizer over the model's parameters was built at {line} in {calls} of the {steps} observed steps: "
            "its state (momentum, Adam's moments, step count) restarted each time.",
    fix="Build the optimizer once, before the training loop, and reuse it in every step instead of building it at {line}.",
    situations={
        "state_reset": Situation(
            when="the same optimizer object's state was emptied or its step count went back",
            message="The state of the optimizer stepped at {line} went back between steps (step count {before} then "
                    "{after}): its momentum and moments restarted.",
            fix="Do not reset optimizer.state or load a saved optimizer state inside the training loop; keep the state "
                "the previous step left."),
    },
)

GP609: Rule[AuditFacts] = Rule(
    code="GP609", name="ema-copy-broken", severity="error", rank=48,
    summary="An EMA (momentum, teacher) copy of the model is trained by the optimizer, or never moves.",
    why="A mean teacher, BYOL/DINO target network or EMA copy must follow the student only through its EMA update. "
        "In the optimizer (and receiving gradients) it is trained directly as well; an EMA update that never changes "
        "it (a rebound local name, a decay of 1, an update of a copy) leaves it at its initial weights.",
    example="opt = Adam(model.parameters())   # includes model.teacher, whose output also feeds the loss",
    message="{count} parameter(s) of {prefix} ({names}) were changed both by optimizer.step() (with a gradient) and "
            "outside it (an EMA update: each write after the step kept {share} of their gap to {student}, the same share "
            "at every step) in the observed steps: the EMA copy is also trained by the optimizer.",
    fix="Keep the EMA copy out of the optimizer (build it over the student's parameters only) and compute its output "
        "under torch.no_grad() or from detached tensors.",
    situations={
        "never_moves": Situation(
            when="an EMA copy outside the optimizer never changed while its student moved, though the steps wrote it or "
                 "computed its update",
            message="{prefix} mirrors {student} ({count} tensors, same names and shapes) and is outside the optimizer, but "
                    "it did not change in any of the {steps} steps while {student} moved ({measured}): its EMA update "
                    "changes nothing.",
            fix="Update the copy in place, e.g. `for t, s in zip(ema.parameters(), model.parameters()): "
                "t.lerp_(s.detach(), 1 - decay)` under torch.no_grad() after optimizer.step(); assigning to a loop "
                "variable or updating a copy of the state dict changes nothing, and a decay of 1 keeps it fixed."),
        "held_never_moves": Situation(
            when="a copy held outside the model (a wrapper holding a deepcopy, a list of shadow tensors, an averaged "
                 "model), found by the in-place writes into it from the model's parameters, never changed while the model "
                 "moved",
            message="{prefix} follows {student} ({count} tensors, each written in place from the parameter of its shape) "
                    "outside the model and the optimizer, but it did not change in any of the {steps} steps while "
                    "{student} moved ({measured}): its EMA update changes nothing.",
            fix="Check the update at {line}: the weight it gives the model, 1 - decay (`t.lerp_(s, 1 - decay)`, "
                "`t.mul_(decay).add_(s, alpha=1 - decay)`), must be above 0; a decay or momentum of 1 (a schedule "
                "already at its end, counted in too few steps) keeps the copy at its initial weights."),
        "fixed_teacher": Situation(
            when="a copy outside the optimizer never changed while its student moved, and what updates it was not measured",
            severity="warning",
            message="{prefix} mirrors {student} ({count} tensors, same names and shapes) and is outside the optimizer, but "
                    "it did not change in any of the {steps} steps while {student} moved.",
            fix="If {prefix} is meant to follow {student} (mean teacher, BYOL/DINO target), update it in place after each "
                "optimizer step (`t.lerp_(s.detach(), 1 - decay)`); if it is a fixed teacher, freeze it "
                "(requires_grad_(False)) to say so."),
        "frozen_copy": Situation(
            when="a copy outside the optimizer that nothing wrote and no update was computed for: a frozen reference "
                 "(DPO/RLHF reference model, a fixed target), healthy by design",
            severity="info",
            message="{prefix} mirrors {student} ({count} tensors, same names and shapes), is outside the optimizer and was "
                    "never written in the {steps} steps (no in-place write, no update computed from it and {student}): "
                    "a frozen copy, such as a reference model or a fixed target.",
            fix="Nothing to do if {prefix} is meant to stay fixed; if it should follow {student} as an EMA, update it in "
                "place after each optimizer step (`t.lerp_(s.detach(), 1 - decay)`)."),
    },
)


@GP603.detector
def detect_lr_zero(facts: AuditFacts) -> Iterator[Finding]:
    groups: dict[tuple[int, int], list] = {}
    for s in facts.opt_steps:
        for g in s.groups:
            groups.setdefault((s.optimizer, g.index), []).append((s, g))
    for (opt, index), seen in groups.items():
        if any(g.lr != 0 for _, g in seen):
            continue
        with_grad = {p for s, g in seen for p in g.params if (s.params[p].grad_at_step or 0) > 0}
        if not with_grad:
            continue
        names = sorted(facts.name(p) for p in with_grad)
        site = facts.schedule_sites.get(opt) or (facts.optimizer_site if opt == facts.initial_optimizer else next(
            (b.location for b in facts.built if b.optimizer == opt), None))
        scheduled = opt in facts.scheduled
        yield GP603.finding("scheduled" if scheduled else None, parameters=names, location=site,
                            evidence={"lr_as_applied": [g.lr for _, g in seen], "optimizer_steps": len(seen)},
                            group=index, count=len(names), names=listed(names), steps=len(seen),
                            sched=" (a scheduler drives this optimizer)" if scheduled else "", line=at(site))


@GP604.detector
def detect_scheduler_first(facts: AuditFacts) -> Iterator[Finding]:
    for opt in {e.optimizer for e in facts.events if e.kind == "scheduler_step"}:
        order = [e for e in facts.events if e.optimizer == opt and e.kind in ("scheduler_step", "optimizer_step")]
        steps = [e for e in order if e.kind == "optimizer_step"]
        if not steps or order[0].kind != "scheduler_step" or order[0].location is None:
            continue
        text = ", ".join(f"{e.kind.replace('_step', '')}.step() {at(e.location)}" for e in order[:4])
        yield GP604.finding(location=order[0].location, evidence={"order": [e.kind for e in order[:8]]},
                            line=at(order[0].location), step_line=at(steps[0].location), order=text)


_REASONS = {
    "not-in-optimizer": ("not_in_optimizer", "they get a gradient but are in no parameter group"),
    "nonfinite": ("nonfinite", "their gradient was inf or nan when optimizer.step() ran"),
    "not-moved": (None, "they are in the optimizer, had a finite non-zero gradient and a non-zero learning rate when "
                        "optimizer.step() ran, and the step still left them unchanged"),
    "no-grad": ("no_grad", "they are in the optimizer but got no gradient at any step"),
}


@GP606.detector
def detect_never_moves(facts: AuditFacts) -> Iterator[Finding]:
    teachers = {p for c in facts.ema if any(c.moved) or c.written() or c.updated() for p in c.params}
    by_reason: dict[str, list[int]] = {}
    for pid, v in facts.verdicts.items():
        if v.reason in _REASONS and pid not in teachers and facts.opt_steps:
            key = "attached" if v.reason == "not-in-optimizer" and v.attached is not None else v.reason
            by_reason.setdefault(key, []).append(pid)
    for key, pids in by_reason.items():
        names = sorted(facts.name(p) for p in pids)
        situation, reason = _REASONS["not-in-optimizer" if key == "attached" else key]
        loc = facts.optimizer_site
        if key == "attached":
            site = facts.verdicts[pids[0]].attached
            situation, loc = "attached", site.location if site else None
            reason = (f"they were attached to the model at {at(loc)} during step {site.call + 1 if site else '?'}, after "
                      "the optimizer was built, and are in no parameter group")
        elif key == "no-grad":
            loc = None
        yield GP606.finding(situation, parameters=names, location=loc, evidence={"reason": key, "tensors": len(names)},
                            count=len(names), names=listed(names), steps=facts.calls, reason=reason, line=at(loc))


@GP607.detector
def detect_state_lost(facts: AuditFacts) -> Iterator[Finding]:
    built = [b for b in facts.built if b.overlaps_model and b.call >= 0]
    calls = {b.call for b in built}
    if len(calls) >= 2:
        yield GP607.finding(location=built[0].location, evidence={"built_in_steps": sorted(c + 1 for c in calls)},
                            line=at(built[0].location), calls=len(calls), steps=facts.calls)
        return
    last: dict[int, float] = {}
    for s in facts.opt_steps:
        prev = last.get(s.optimizer)
        if s.state_step is not None and prev is not None and s.state_step <= prev:
            yield GP607.finding("state_reset", location=s.location, evidence={"state_step": [prev, s.state_step]},
                                line=at(s.location), before=prev, after=s.state_step)
            return
        if s.state_step is not None:
            last[s.optimizer] = s.state_step


def _ema_measured(copy: EmaCopy) -> tuple[str, str]:
    """The situation of a copy that never moved, from what the steps measured doing to it."""
    if copy.written():
        return "never_moves", (f"{copy.written()} in-place write(s) into its tensors over the steps, its values "
                               "unchanged")
    if copy.updated():
        return "never_moves", (f"an update combining it with {copy.student or 'the model'} was computed at "
                               f"{copy.updated()} step(s) but never written into its tensors")
    return ("fixed_teacher", "") if copy.writes is None else ("frozen_copy", "never written")


@GP609.detector
def detect_ema(facts: AuditFacts) -> Iterator[Finding]:
    for copy in facts.trained_copies:
        trained = [pid for pid in copy.params if facts.verdicts[pid].moved_by_step and facts.verdicts[pid].grad_at_step
                   and facts.verdicts[pid].moved_outside]
        if not trained or not constant_share(copy.kept):
            continue
        names = sorted(facts.name(p) for p in trained)
        yield GP609.finding(parameters=names, location=facts.optimizer_site,
                            evidence={"tensors": len(names), "kept_gap_after_step": copy.kept[:16], "twin": copy.student},
                            count=len(names), prefix=copy.prefix, names=listed(names), student=copy.student,
                            share=f"{sum(copy.kept) / len(copy.kept):.4g}")
    student_moved = {pid for pid, v in facts.verdicts.items() if v.moved_by_step}
    for copy in facts.ema:
        first = _first_full_copy(copy)
        if any(copy.moved[first:]) or not student_moved & set(copy.students) or len(copy.moved) <= first:
            continue
        names = sorted(facts.name(p) for p in copy.params)
        situation, measured = _ema_measured(copy)
        if copy.held_outside:
            situation = "held_never_moves"
            writes = sum((copy.writes or [])[first:])
            measured = ("after a first update that copied it onto the model outright, " if first else "") + \
                f"{writes} in-place write(s) into its tensors over those steps, its values unchanged"
        yield GP609.finding(situation, parameters=names, location=copy.site,
                            evidence={"moved_per_step": copy.moved, "tensors": len(names), "writes_per_step": copy.writes,
                                      "updates_computed_per_step": copy.computed, "kept_gap_per_step": copy.kept[:16]},
                            prefix=copy.prefix, student=copy.student or "the model", count=len(names),
                            steps=facts.calls - first, measured=measured, line=at(copy.site))


def _first_full_copy(copy: EmaCopy) -> int:
    """1 when a copy held outside the model was copied onto the model outright at its first update (torch's
    AveragedModel and diffusers' EMAModel start so) and measured over at least 2 more steps: that step is no EMA step."""
    return int(copy.held_outside and len(copy.kept) >= 3 and len(copy.moved) == len(copy.kept) and copy.kept[0] < 1e-6)


UPDATE_RULES: tuple[Rule[AuditFacts], ...] = (GP603, GP604, GP606, GP607, GP609)
