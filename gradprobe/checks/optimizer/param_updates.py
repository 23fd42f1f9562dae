"""GP207: did one real step move every parameter that had a gradient? The step's zero_grad/step calls, observed.

`StepObserver` records the order of backward, zero_grad and step, and each parameter's gradient after backward and
at step() time; `analyze_step` compares the parameters before and after the step and says why a stuck one did not move.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn as nn

from gradprobe.checks.core.step import param_names
from gradprobe.checks.optimizer.several_optimizers import StepOwners
from gradprobe.checks.core.torchcompat import untraced
from gradprobe.checks.core.watches import patched
from gradprobe.findings import Finding, Rule, Situation, run_rules
from gradprobe.userframes import UserCode

GP207: Rule[StuckFacts] = Rule(
    code="GP207", name="param-not-updated", severity="error", rank=37,
    summary="After one real step a parameter with a nonzero gradient did not change.",
    why="Something between backward() and step() lost the update: zero lr, zero_grad between backward and step, a skipped "
        "GradScaler step, or the parameter missing from the optimizer.",
    example="loss.backward(); optimizer.zero_grad(); optimizer.step()",
    message="{count} parameter(s) had a nonzero gradient after backward() but did not change in one real step: {reason}.",
    fix="Call optimizer.zero_grad() before backward(), then optimizer.step() right after backward().",
    situations={
        "at_line": Situation(
            when="the line responsible is known (the optimizer's, or the zero_grad() between backward and step)",
            message="{count} parameter(s) had a nonzero gradient after backward() but did not change in one real step: "
                    "{reason} (line {line} of {file})."),
        "zero_lr": Situation(
            when="their param group has lr 0 (the line is the one that gave it lr 0, where known)",
            message="{count} parameter(s) had a nonzero gradient after backward() but did not change in one real step: "
                    "{reason}{where}.",
            fix="Give their param group a positive learning rate where it is set{where} (see GP205); the zero_grad/step "
                "order is not the cause."),
        "not_in_optimizer": Situation(
            when="they are in no param group of the optimizer",
            message="{count} parameter(s) had a nonzero gradient after backward() but did not change in one real step: "
                    "{reason}{where}.",
            fix="Add them to the optimizer built{where} (build it from model.parameters() once the model is complete)."),
        "zeroed_unseen": Situation(
            when="their gradient was zero when step() ran, and no zero_grad() call between backward() and step() did it "
                 "(a clip, a hook or a callback wrote the gradient)",
            message="{count} parameter(s) had a nonzero gradient after backward() but did not change in one real step: "
                    "{reason}, by code other than zero_grad() (no zero_grad() ran between them).",
            fix="Find the code that runs between backward() and optimizer.step() and writes these parameters' .grad (a "
                "clip with a threshold of 0, a gradient hook, a callback that calls p.grad.zero_() or sets it to None); "
                "audit_training, or diagnose with steps, names its line."),
        "scaler_skipped": Situation(
            when="a GradScaler skipped optimizer.step() after a finite loss whose scaled gradients overflowed float16 "
                 "(the scaler then halves its scale: normal at the start of fp16 training)",
            severity="info",
            message="{count} parameter(s) had a gradient after backward() but did not change in one real step: the "
                    "GradScaler skipped optimizer.step() because the gradients overflowed at its scale of {scale:g} "
                    "(the loss before scaling was finite).",
            fix="Nothing to change for this step; audit_training (or diagnose with steps) shows whether later steps "
                "run once the scale has come down."),
        "not_stepped": Situation(
            when="optimizer.step() did not run after backward (or a GradScaler skipped it)",
            message="{count} parameter(s) had a nonzero gradient after backward() but did not change in one real step: "
                    "{reason}.",
            fix="Call optimizer.step() after backward() (with a GradScaler: scaler.step(optimizer); scaler.update(), "
                "and check the gradients for inf/NaN)."),
    },
)

# why a parameter with a gradient did not move, as said in GP207's message and evidence
NOT_IN_OPTIMIZER = "not in the optimizer"
NOT_STEPPED = "optimizer.step() was not called (or a GradScaler skipped it after inf/NaN gradients)"
ZERO_LR = "its param group has lr=0"
ZEROED_BETWEEN = "its gradient was zeroed between backward() and step()"
UNEXPLAINED = "step() ran with a nonzero gradient but the value did not change"


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2, tensor parallel), a plain tensor as it is: each rank runs these checks on its
    own, and an op on a DTensor is a collective that the other ranks, on another path of their checks, never join."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) and hasattr(t, "placements") else t


def _grad_max(p: torch.Tensor) -> float:
    with untraced():  # not the user's ops: invisible to a trace running beside us
        g = _local(p.grad) if p.grad is not None else None
        return float(g.abs().max()) if g is not None and g.numel() else 0.0


class StepObserver:
    """Records zero_grad/step calls and each parameter's gradient at step() time."""

    def __init__(self, model: nn.Module, optimizer: Any, user: UserCode | None = None, record: Any = None) -> None:
        self.model, self.optimizer, self.user = model, optimizer, user
        # with the build record: which of the target's optimizers each step() ran on (GP211)
        self.owners = StepOwners(model, optimizer, record, user) if record is not None and user is not None else None
        self.events: list[str] = []
        self.sites: dict[int, dict[str, Any] | None] = {}  # event index -> the user line of a zero_grad call
        self.grad_at_step: dict[int, float] = {}
        self.grad_after_backward: dict[int, float] = {}

    def _zero_grad_spy(self, orig: Any, event: str) -> Any:
        events, sites, user = self.events, self.sites, self.user

        def spy(obj: Any, *a: Any, **k: Any) -> Any:
            if user is not None:
                sites[len(events)] = user.innermost(skip=2)
            events.append(event)
            return orig(obj, *a, **k)
        return spy

    def __enter__(self) -> StepObserver:
        stack = self._stack = contextlib.ExitStack()
        if self.owners is not None:
            stack.enter_context(self.owners)
        stack.enter_context(patched(torch.optim.Optimizer, "zero_grad",
                                    self._zero_grad_spy(torch.optim.Optimizer.zero_grad, "optimizer.zero_grad")))
        stack.enter_context(patched(nn.Module, "zero_grad", self._zero_grad_spy(nn.Module.zero_grad, "model.zero_grad")))
        if isinstance(self.optimizer, torch.optim.Optimizer):
            stack.callback(self.optimizer.register_step_pre_hook(self._pre_step).remove)
        for p in self.model.parameters():
            if p.requires_grad:
                stack.callback(p.register_post_accumulate_grad_hook(self._accumulated).remove)
        return self

    def _accumulated(self, p: torch.Tensor) -> None:
        if "backward" not in self.events[-1:]:
            self.events.append("backward")
        self.grad_after_backward[id(p)] = _grad_max(p)

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.events.append("optimizer.step")
        for p in self.model.parameters():
            self.grad_at_step[id(p)] = _grad_max(p)

    def __exit__(self, *exc: object) -> Literal[False]:
        self._stack.close()
        return False


def snapshot(model: nn.Module) -> dict[int, torch.Tensor]:
    return {id(p): _local(p.detach()).clone() for p in model.parameters() if p.requires_grad}


def _zeroed_between_at(obs: StepObserver) -> dict[str, Any] | None:
    """The user line of the zero_grad() that ran after the last backward() and before step()."""
    ev = obs.events
    if "optimizer.step" not in ev:
        return None
    stop = ev.index("optimizer.step")
    start = max((i for i in range(stop) if ev[i] == "backward"), default=-1)
    return next((obs.sites.get(i) for i in range(stop - 1, start, -1) if ev[i].endswith("zero_grad")), None)


@dataclass
class StuckFacts:
    """Parameters with a gradient that one real step left unchanged, grouped by why; where each reason points."""

    stuck: dict[str, list[str]]
    where: dict[str, dict[str, Any] | None]
    events: list[str]


def _reason(p: torch.Tensor, in_opt: set[int], lr_of: dict[int, Any], stepped: bool, obs: StepObserver) -> str:
    if id(p) not in in_opt:
        return NOT_IN_OPTIMIZER
    if not stepped:
        return NOT_STEPPED
    if lr_of.get(id(p)) == 0:
        return ZERO_LR
    if obs.grad_at_step.get(id(p), 0.0) == 0.0:
        return ZEROED_BETWEEN
    return UNEXPLAINED


def measure_stuck(model: nn.Module, optimizer: Any, before: dict[int, torch.Tensor], obs: StepObserver,
                  explained: set[str], opt_site: dict[str, Any] | None, zero_lr_at: dict[str, Any] | None = None) -> StuckFacts:
    names = param_names(model)
    in_opt = {id(t) for g in optimizer.param_groups for t in g["params"]}
    lr_of = {id(t): g.get("lr") for g in optimizer.param_groups for t in g["params"]}
    stuck: dict[str, list[str]] = {}
    stepped = "optimizer.step" in obs.events
    for p in model.parameters():
        if id(p) not in before:
            continue
        g = obs.grad_after_backward.get(id(p), 0.0)
        if g <= 0.0 or not torch.equal(before[id(p)], _local(p.detach())):
            continue
        name = names[id(p)][0]
        if name not in explained:
            stuck.setdefault(_reason(p, in_opt, lr_of, stepped, obs), []).append(name)
    where = {NOT_IN_OPTIMIZER: opt_site, ZERO_LR: zero_lr_at or opt_site, ZEROED_BETWEEN: _zeroed_between_at(obs)}
    return StuckFacts(stuck, where, obs.events[:30])


_BY_REASON = {ZERO_LR: "zero_lr", NOT_IN_OPTIMIZER: "not_in_optimizer", NOT_STEPPED: "not_stepped"}


@GP207.detector
def detect_not_updated(facts: StuckFacts) -> Iterator[Finding]:
    for reason, params in facts.stuck.items():
        at = facts.where.get(reason)
        where = {"line": at["line"], "file": at["file"].rsplit("/", 1)[-1]} if at else {}
        said = f" (line {where['line']} of {where['file']})" if at else ""
        situation = _BY_REASON.get(reason) or ("at_line" if at else "zeroed_unseen" if reason == ZEROED_BETWEEN else None)
        yield GP207.finding(situation, count=len(params), reason=reason, **where, where=said,
                            parameters=params, location=at, evidence={"reason": reason, "call_order": facts.events})


def scaler_skipped(f: Finding, scale: float) -> Finding:
    """GP207 `f` (not stepped) measured again: a GradScaler skipped the step after a finite loss overflowed at its scale."""
    return GP207.finding("scaler_skipped", parameters=list(f["parameters"]), location=f["location"],
                         evidence={**f["evidence"], "scale": scale}, count=len(f["parameters"]), scale=scale)


def stuck_findings(model: nn.Module, optimizer: Any, before: dict[int, torch.Tensor], obs: StepObserver,
                   explained: set[str], opt_site: dict[str, Any] | None,
                   zero_lr_at: dict[str, Any] | None = None) -> list[Finding]:
    """GP207 for the parameters (but those in `explained`) that had a gradient and did not move; `zero_lr_at` is the
    line that gave a group lr 0 (its builder or scheduler), where known."""
    return run_rules((GP207,), measure_stuck(model, optimizer, before, obs, explained, opt_site, zero_lr_at))
