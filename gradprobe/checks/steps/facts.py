"""What several observed steps measured, as typed facts the GP6xx rules read (no torch here).

The observer (observe.py) fills the per-event records; the engine (engine.py) adds what it measured
between the calls of the step (parameters changed outside the optimizer, EMA copies); `derive`
then gives each parameter its verdict over the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from gradprobe.checks.core.rule_text import and_more, file_line


@dataclass
class Event:
    call: int  # which observed call of the step (0-based)
    kind: str  # backward | zero_grad | scheduler_step | optimizer_step
    location: dict | None
    optimizer: int | None = None


@dataclass
class LossScaling:
    """A loss's graph read from its top (accumulation.py `loss_scaling`): the constant multiplications and divisions met
    before the first other operation, and that operation when it is a reduction whose weight is known."""

    ops: list[float]  # each constant multiplier, from the top (a division by 4 is 0.25)
    reduction: str | None = None  # "mean" | "sum" | None (the walk ended at something else: a sum of terms, a masked sum)
    count: float | None = None  # the total weight the reduction gives its elements: 1 for a mean, their number for a sum
    stopped_at: str | None = None  # the grad_fn name the walk ended at
    lines: list[dict | None] = field(default_factory=list)  # per op, the user line that computed it (when traced)
    in_library: list[bool] = field(default_factory=list)  # per traced op: computed inside a library the line called

    @property
    def factor(self) -> float:
        return math.prod(self.ops)

    @property
    def mass(self) -> float | None:
        """factor x count: the share of one mean over all the elements this loss stands for (1.0: a mean)."""
        return self.factor * self.count if self.count is not None else None


@dataclass
class BackwardCall:
    call: int
    location: dict | None
    scaled: bool  # the loss's last op is a multiplication or division (by a constant or a tensor)
    top: str | None  # the loss's grad_fn name
    stale: bool  # gradients left from before the previous optimizer step were still there
    stale_norm: float = 0.0
    after_norm: float = 0.0  # the total gradient norm right after this backward
    scaling: LossScaling | None = None  # the loss's constant scaling and reduction (None: not a scalar, or not read)
    value: float | None = None  # the loss's value (a scalar loss), read at backward()


@dataclass
class GradChange:
    """A gradient that changed between the last backward and optimizer.step()."""

    param: int
    before: float
    after: float | None  # None: set to None
    location: dict | None  # the user line that wrote it last, when seen
    op: str
    writers: list[str] = field(default_factory=list)  # every write seen, in order: "file.py:LINE op"


@dataclass
class GroupStep:
    index: int
    lr: float
    params: list[int]
    grad_after_backward: float | None = None
    grad_at_step: float | None = None
    update: float | None = None
    weight: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.update / self.weight if self.update is not None and self.weight else None


@dataclass
class ParamStep:
    grad_after_backward: float | None
    grad_at_step: float | None
    update: float | None = None
    weight: float | None = None
    moved: bool = False


@dataclass
class OptStep:
    call: int
    optimizer: int
    location: dict | None
    backwards: list[BackwardCall]
    zero_grads_between: list[tuple[dict | None, int]]  # zero_grad after a backward: (line, backward calls before it)
    changes: list[GradChange]
    groups: list[GroupStep] = field(default_factory=list)
    params: dict[int, ParamStep] = field(default_factory=dict)
    others: dict[int, float | None] = field(default_factory=dict)  # gradient norms of tracked tensors in no group
    state_size: int = 0
    state_step: float | None = None
    dropout: int = 0  # the model's dropout modules with p > 0 when optimizer.step() ran
    dropout_in_eval: list[str] = field(default_factory=list)  # ... of those, the ones in eval mode (names)


@dataclass
class GradCall:
    call: int
    location: dict | None
    create_graph: bool
    inputs_are_parameters: bool
    probes: list[Any] = field(default_factory=list)  # tensors it returned, marked to see whether a loss used them
    used_in_backward: bool = False


@dataclass
class ScalerStep:
    """One GradScaler.step(optimizer): the scale it ran with, and whether it skipped the optimizer step (inf/nan)."""

    call: int
    location: dict | None
    scale: float | None
    skipped: bool


@dataclass
class ModeCall:
    """A user call of module.train(mode) / module.eval() (the outermost one: not the calls it makes on children)."""

    call: int
    location: dict | None
    training: bool
    module: int  # id of the module it was called on
    covers: set[int] = field(default_factory=set)  # ids of the dropout modules it set


@dataclass
class OptimizerBuilt:
    call: int
    location: dict | None
    optimizer: int
    overlaps_model: bool


@dataclass
class AttachSite:
    call: int
    location: dict | None
    params: set[int]


@dataclass
class EmaCopy:
    """Model parameters that mirror trainable ones by relative module path and shape (an EMA/momentum copy, a frozen
    reference model), and what the steps measured doing to them (copies.py)."""

    prefix: str  # teacher's module path, e.g. "target"
    student: str  # the trainable twin's path, e.g. "online"
    params: list[int]
    students: list[int]
    moved: list[bool] = field(default_factory=list)  # per call
    kept: list[float] = field(default_factory=list)  # per call: |t1 - s| / |t0 - s| (an EMA keeps its decay of the gap)
    site: dict | None = None
    writes: list[int] | None = None  # per call: in-place writes into its tensors (version counters); None: not measured
    computed: list[int] | None = None  # per call: ops combining its tensors with the student's (an update computed)
    held_outside: bool = False  # found by what writes it, outside the model (outside_copies.py), not by its name

    def written(self) -> int:
        return sum(self.writes or ())

    def updated(self) -> int:
        """Calls in which an update of this copy was computed out of place (t = d * t + (1 - d) * s)."""
        return sum(1 for n in self.computed or () if n)


@dataclass
class FullBatch:
    """After an optimizer step fed by k > 1 backward() calls: the gradient of the same batch as one batch (the target's
    loss on it, from the pre-step weights), beside the accumulated one (fullbatch.py). Ratios are of the norms."""

    call: int
    k: int  # backward() calls that fed the step
    location: dict | None  # the micro-batch backward() line
    step_location: dict | None
    loss: str  # what the full-batch loss was: "loss_fn" | "the model's .loss"
    accumulated: float  # norm of the gradient after the last micro-batch backward() (before clipping)
    full: float  # norm of the full-batch gradient
    groups: list[tuple[int, float | None, float | None]] = field(default_factory=list)  # (group, accumulated, full)
    zeroed_inside: bool = False  # zero_grad() ran between the micro-batches
    step_index: int = 0  # its index among the observed optimizer steps
    factors: list[float | None] = field(default_factory=list)  # each micro-batch loss's constant factor (accumulation.py)
    compared: int = 0  # the parameters both gradients were taken over (fullbatch.nearest: those nearest the loss)
    elements: int = 0  # ... and their elements
    of_params: int = 0  # the step's parameters with a gradient that the loss reaches
    of_elements: int = 0

    @property
    def ratio(self) -> float | None:
        return self.accumulated / self.full if self.full else None


@dataclass
class SchedulePace:
    """An LR scheduler of the main optimizer against the data it is stepped over (script mode: schedule.py)."""

    scheduler: str  # class name
    period_name: str  # T_max, step_size, milestones, T_0, total_steps
    period: int  # in scheduler.step() calls
    scheduler_steps: int  # scheduler.step() calls over the watched optimizer steps
    optimizer_steps: int  # optimizer steps watched
    steps_per_epoch: int  # optimizer steps one pass over the DataLoader takes (its len / batches per step)
    batches_per_epoch: int  # len() of the DataLoader the steps consumed
    batches_per_step: float
    location: dict | None  # where scheduler.step() is called (or where the scheduler was built, when never stepped)


@dataclass
class Verdict:
    name: str
    in_optimizer: bool
    requires_grad: bool
    grad_after_backward: bool = False  # a finite non-zero gradient after some backward
    grad_at_step: bool = False  # ... still there when optimizer.step() ran
    grad_present: bool = False  # a gradient (even zero) existed at some step
    nonfinite: bool = False
    moved_by_step: bool = False
    moved_outside: bool = False
    lr_zero: bool = False
    zeroed_between: bool = False
    attached: AttachSite | None = None
    reason: str = "ok"


@dataclass
class AuditFacts:
    calls: int
    mode: str  # train_step | default
    names: dict[int, str]
    requires_grad: dict[int, bool]
    opt_steps: list[OptStep]
    events: list[Event]
    grad_calls: list[GradCall]
    built: list[OptimizerBuilt]
    attached: list[AttachSite]
    initial_optimizer: int | None
    optimizer_site: dict | None
    scheduled: set[int]  # optimizers a scheduler drives
    schedule_sites: dict[int, dict]  # id(optimizer) -> the user's line defining its schedule (a LambdaLR lambda)
    outside_moves: dict[int, list[bool]]  # id -> per call: changed outside the optimizer
    ema: list[EmaCopy]
    trained_copies: list[EmaCopy] = field(default_factory=list)  # in the optimizer and moved toward a twin outside it
    step_error: str | None = None
    scaler_steps: list[ScalerStep] = field(default_factory=list)
    mode_calls: list[ModeCall] = field(default_factory=list)
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    full_batch: FullBatch | None = None
    full_batch_left_out: str | None = None  # why the full-batch comparison was not made, when accumulation was seen
    schedules: list[SchedulePace] = field(default_factory=list)
    members: list[str] = field(default_factory=list)  # several models checked as one (a ModelSet): their names

    def name(self, pid: int) -> str:
        return self.names.get(pid, f"<tensor {pid:#x}>")

    def in_optimizer(self) -> set[int]:
        return {pid for s in self.opt_steps for g in s.groups for pid in g.params}


def _finite_nonzero(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def _grad_facts(v: Verdict, pid: int, facts: AuditFacts) -> None:
    lrs = []
    for s in facts.opt_steps:
        ps = s.params.get(pid)
        if ps is None:
            continue
        v.grad_after_backward |= _finite_nonzero(ps.grad_after_backward)
        v.grad_at_step |= _finite_nonzero(ps.grad_at_step)
        v.grad_present |= ps.grad_at_step is not None or ps.grad_after_backward is not None
        v.nonfinite |= ps.grad_at_step is not None and not math.isfinite(ps.grad_at_step)
        v.moved_by_step |= ps.moved
        lrs += [g.lr for g in s.groups if pid in g.params]
        v.zeroed_between |= any(c.param == pid and not c.after for c in s.changes)
    v.lr_zero = bool(lrs) and all(lr == 0 for lr in lrs)


def _reason(v: Verdict) -> str:
    if not v.requires_grad:
        return "frozen-moved" if v.moved_outside else "frozen"
    if v.moved_by_step or v.moved_outside:
        return "ok"
    if not v.in_optimizer:
        return "not-in-optimizer" if v.grad_after_backward else "outside-optimizer-no-grad"
    if v.nonfinite:
        return "nonfinite"
    if v.zeroed_between and not v.grad_at_step:
        return "zeroed-between"
    if not v.grad_after_backward and not v.grad_at_step:
        return "zero-grad" if v.grad_present else "no-grad"
    if v.lr_zero:
        return "lr-zero"
    return "not-moved"


def derive(facts: AuditFacts) -> None:
    """Each parameter's verdict over the steps: in the optimizer, a finite non-zero gradient at step time, moved."""
    in_opt = facts.in_optimizer()
    late = {pid: a for a in facts.attached if a.call >= 0 for pid in a.params}
    for pid, name in facts.names.items():
        v = Verdict(name=name, in_optimizer=pid in in_opt, requires_grad=facts.requires_grad.get(pid, False))
        _grad_facts(v, pid, facts)
        if not v.in_optimizer and not v.grad_after_backward:
            v.grad_after_backward = any(_finite_nonzero(s.others.get(pid)) for s in facts.opt_steps)
        v.moved_outside = any(facts.outside_moves.get(pid, ()))
        v.attached = late.get(pid)
        v.reason = _reason(v)
        facts.verdicts[pid] = v


at = file_line  # the steps family's name for it


def listed(names: list[str], limit: int = 4) -> str:
    return and_more(names, limit)
