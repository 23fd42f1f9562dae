"""GP612: an LR schedule sized in one unit (epochs, or batches) stepped in the other, measured in the script's own loop.

Script mode knows the DataLoader the steps consume (its len(), and how many batches each optimizer step took) and sees
every scheduler.step() of the main optimizer's scheduler. A schedule whose period (CosineAnnealingLR's T_max,
StepLR's step_size, MultiStepLR's last milestone, CosineAnnealingWarmRestarts' T_0, OneCycleLR's total_steps) is shorter
than one epoch's optimizer steps while scheduler.step() runs at every optimizer step finishes, decays or restarts
inside the first epoch: a period written in epochs, stepped per batch. The reverse: a period that is a whole number of
epochs' batches (T_max = len(loader), OneCycleLR's epochs x steps_per_epoch) while scheduler.step() never ran in the
watched steps of an epoch that had not ended: stepped once per epoch, the schedule barely moves.

Public reports: https://github.com/kohya-ss/sd-scripts/issues/601 (T_max counts scheduler.step() calls, not epochs),
https://github.com/konstmish/prodigy/issues/10 (T_max in steps or epochs?), https://github.com/sthalles/SimCLR/issues/8
(T_max=len(train_loader) with scheduler.step() once per epoch), https://github.com/skorch-dev/skorch/issues/610.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gradprobe.checks.steps.facts import AuditFacts, Event, SchedulePace, at
from gradprobe.findings import Finding, Rule, Situation

GP612: Rule[AuditFacts] = Rule(
    code="GP612", name="schedule-unit-mismatch", severity="warning", rank=45,
    summary="An LR scheduler whose period is in epochs is stepped at every batch (or one sized in batches is stepped once "
            "per epoch): the schedule ends, decays or restarts inside the first epoch (or barely moves).",
    why="A scheduler counts scheduler.step() calls, nothing else. CosineAnnealingLR(T_max=epochs) or StepLR(step_size=30) "
        "stepped after every batch runs its whole schedule within the first `period` batches and then restarts or keeps "
        "decaying; OneCycleLR(total_steps=epochs * len(loader)) or T_max=len(loader) stepped once per epoch stays near its "
        "first value for the whole run. The loss still goes down, only not on the intended schedule. Measured in script "
        "mode only, where the DataLoader the steps consume gives the epoch (its len() and the batches each step takes): "
        "the build_model() form has no epoch by construction (`inputs` returns one batch, the step is called on it "
        "again and again, and gradprobe's own default step steps the scheduler once per call).",
    example="sched = CosineAnnealingLR(opt, T_max=num_epochs)\nfor x, y in loader: ...; opt.step(); sched.step()  # per batch",
    message="{scheduler}({period_name}={period}) is stepped at every optimizer step ({stepped} scheduler.step() calls at "
            "{line} over {intervals} intervals between the {steps} optimizer steps watched), and one epoch of the "
            "DataLoader is {batches} batches ({per_epoch} optimizer steps at {per_step:g} batch(es) per step): its "
            "schedule of {period} steps is over {over:.3g} times within the first epoch.",
    fix="Either step the scheduler once per epoch (move scheduler.step() at {line} out of the batch loop), or size the "
        "schedule in optimizer steps: {period_name}={suggested}, the number of epochs times one epoch's optimizer steps.",
    situations={
        "per_epoch": Situation(
            when="a schedule sized in batches (a whole number of epochs' batches) is not stepped at any watched batch",
            message="{scheduler}({period_name}={period}) is sized in batches ({period} = {epochs:g} x the DataLoader's "
                    "{batches} batches per epoch) but scheduler.step() ran at none of the {steps} optimizer steps "
                    "watched inside the first epoch: stepped once per epoch, it takes {period} epochs to run its "
                    "schedule. Scheduler built at {line}.",
            fix="Call scheduler.step() after every optimizer.step() (inside the batch loop), or size the schedule in "
                "epochs ({period_name}={epochs:g}) if it is meant to be stepped per epoch."),
    },
)

SCHEDULE_RULES: tuple[Rule[AuditFacts], ...] = (GP612,)

# a period attribute of torch's LR schedulers, in scheduler.step() calls (LinearLR/ConstantLR's total_iters is a warm-up:
# shorter than an epoch is normal there, and CyclicLR cycles within an epoch by design)
_PERIODS = ("T_max", "step_size", "T_0", "total_steps")


def period_of(sched: Any) -> tuple[str, int] | None:
    """The scheduler's period and its attribute name, in scheduler.step() calls, when it has one."""
    for attr in _PERIODS:
        v = getattr(sched, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return attr, v
    ms = getattr(sched, "milestones", None)
    if ms and all(isinstance(m, int) for m in ms):
        return "milestones", max(ms)
    return None


def pace(sched: Any, events: list[Event], opt_id: int, steps: int, loader: list[tuple[int | None, int]],
         built: dict | None) -> SchedulePace | None:
    """The scheduler's period against the watched loop: `loader` per watched main step is (len(DataLoader) or None,
    batches fetched since the previous main step); events' `call` is the number of main steps done when they ran."""
    found = period_of(sched)
    lens = [n for n, _ in loader[1:] if n]
    per = [b for _, b in loader[1:] if b > 0]
    if found is None or steps < 2 or not lens or len(set(lens)) != 1 or len(per) != len(loader) - 1:
        return None
    batches, per_step = lens[0], sum(per) / len(per)
    mine = [e for e in events if e.kind == "scheduler_step" and e.optimizer == opt_id]
    after = {e.call for e in mine if 1 <= e.call <= steps - 1}
    before = {e.call for e in mine if 0 <= e.call <= steps - 2}
    stepped = max(len(after), len(before))
    location = mine[0].location if mine else built
    stepped_at = {at(e.location) for e in events if e.kind == "optimizer_step" and e.location is not None}
    if mine and built is not None and location is not None and at(location) in stepped_at:
        location = built  # stepped inside a framework's call (Lightning's fit()): the line that built it is the user's
    return SchedulePace(scheduler=type(sched).__name__, period_name=found[0], period=found[1], scheduler_steps=stepped,
                        optimizer_steps=steps, steps_per_epoch=max(1, round(batches / per_step)),
                        batches_per_epoch=batches, batches_per_step=per_step,
                        location=location)


@GP612.detector
def detect_schedule_unit(facts: AuditFacts) -> Iterator[Finding]:
    for p in facts.schedules:
        intervals = p.optimizer_steps - 1
        ev = {"scheduler": p.scheduler, p.period_name: p.period, "scheduler_steps_in_intervals": p.scheduler_steps,
              "intervals": intervals, "batches_per_epoch": p.batches_per_epoch, "batches_per_step": p.batches_per_step,
              "optimizer_steps_per_epoch": p.steps_per_epoch}
        if p.scheduler_steps == intervals and p.period < p.steps_per_epoch:
            yield GP612.finding(location=p.location, evidence=ev, scheduler=p.scheduler, period_name=p.period_name,
                                period=p.period, stepped=p.scheduler_steps, line=at(p.location), intervals=intervals,
                                steps=p.optimizer_steps, batches=p.batches_per_epoch, per_epoch=p.steps_per_epoch,
                                per_step=round(p.batches_per_step, 2), over=p.steps_per_epoch / p.period,
                                suggested=f"epochs * {p.steps_per_epoch}")
        elif (p.scheduler_steps == 0 and p.optimizer_steps * p.batches_per_step < p.batches_per_epoch
              and p.period >= p.steps_per_epoch and p.period % p.steps_per_epoch == 0
              and p.period_name in ("T_max", "total_steps")):
            yield GP612.finding("per_epoch", location=p.location, evidence=ev, scheduler=p.scheduler,
                                period_name=p.period_name, period=p.period, epochs=p.period / p.steps_per_epoch,
                                batches=p.batches_per_epoch, steps=p.optimizer_steps, line=at(p.location))


def schedule_lines(facts: AuditFacts) -> list[str]:
    """The all-clear: each scheduler's period against the DataLoader's epoch and where it was stepped."""
    out = []
    for p in facts.schedules:
        how = (f"stepped at {p.scheduler_steps} of {p.optimizer_steps - 1} intervals between optimizer steps"
               if p.scheduler_steps else "not stepped during the watched steps (per epoch)")
        out.append(f"{p.scheduler}({p.period_name}={p.period}): {how}; the DataLoader has {p.batches_per_epoch} batches "
                   f"per epoch ({p.steps_per_epoch} optimizer steps)")
    return out
