"""GP212, GP213: with several optimizers (a GAN, actor-critic), which one clears and which one steps which parameters,
over the audited steps (audit_training: the user's own train_step, or a script's own loop; the default step drives one
optimizer). In script mode (scriptmode/watch_steps.py) the watch starts at the main optimizer's first step, over the
optimizers alive then, and one "call" runs from one main step to the next.

Measured by identity on the optimizers the target holds (checks/optimizer/several_optimizers.live_optimizers) and their
parameters, never by names:

    GP212 zero-grad-on-wrong-optimizer   a parameter's gradient that its optimizer's step() had already used was still
                                         there when the next backward() added to it (a gradient hook reads .grad just
                                         before accumulation) and that optimizer's next step() used the sum, its
                                         optimizer's zero_grad() never ran, and another
                                         optimizer's zero_grad() ran again after that one's own step(): the line that
                                         was meant for the first one.
    GP213 optimizer-never-stepped        backward() gave the parameters of an optimizer nonzero gradients in every
                                         observed step, and its step() never ran while another optimizer's did.

Public threads these are written from: pytorch/examples issue #116 and the DCGAN loop (each network's optimizer is
cleared and stepped around its own loss), clovaai/stargan-v2 issue #16 (one optimizer per network).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gradprobe.checks.core.step import param_names
from gradprobe.checks.core.rule_text import line_of
from gradprobe.checks.optimizer.several_optimizers import live_optimizers
from gradprobe.findings import Finding, Rule, run_rules
from gradprobe.userframes import UserCode

Loc = dict[str, Any]

GP212: Rule[OwnerFacts] = Rule(
    code="GP212", name="zero-grad-on-wrong-optimizer", severity="error", rank=7,
    summary="One optimizer's gradients are never cleared, while another optimizer's zero_grad() runs twice per iteration.",
    why="With several optimizers each one must clear its own parameters' gradients between its steps. A zero_grad() "
        "called on the other optimizer (opt_d.zero_grad() where opt_g.zero_grad() was meant) leaves one network's "
        "gradients to add up over the iterations: each step() uses the sum of all earlier gradients.",
    example="opt_d.step(); opt_d.zero_grad()  # meant opt_g.zero_grad()\ng_loss.backward(); opt_g.step()",
    message="The gradients of {count} parameter(s) held by {optimizer} (built at {built_at}) are never cleared: the "
            "gradient its step() at {step_at} had used was still there when backward() at {backward_at} added to it "
            "({names}), and {optimizer}.zero_grad() never ran in {calls} steps. Meanwhile zero_grad() at {zero_at} "
            "cleared {other} (built at {other_at}) again, after {other}'s own step() at {other_step_at}.",
    fix="Call zero_grad() on the optimizer built at {built_at} at {zero_at} (or before the backward() at {backward_at}), "
        "not on the one built at {other_at}: each optimizer clears its own parameters' gradients between its steps.",
)

GP213: Rule[OwnerFacts] = Rule(
    code="GP213", name="optimizer-never-stepped", severity="error", rank=8,
    summary="An optimizer whose parameters get gradients is never stepped, while another optimizer is.",
    why="With several optimizers, the one whose step() is never called leaves its parameters where they started: "
        "backward() reaches them at every iteration, and nothing applies the gradient.",
    example="d_loss.backward(); opt_d.step(); g_loss.backward()  # opt_g.step() missing",
    message="{optimizer} (built at {built_at}) holds {count} parameter(s) that backward() at {backward_at} gave a "
            "nonzero gradient in each of {calls} steps ({names}), but its step() never ran, while {other}'s step() "
            "ran at {other_step_at}: they never move.",
    fix="Call step() on the optimizer built at {built_at} after the backward() at {backward_at} that reaches its "
        "parameters (as {other}'s step() at {other_step_at} follows its own), then clear it with its zero_grad().",
)


@dataclass
class OwnerFacts:
    """What the watch measured over the audited calls."""

    calls: int = 0
    live: list[Any] = field(default_factory=list)
    sites: dict[int, Loc | None] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    owner: dict[int, int] = field(default_factory=dict)  # id(param) -> id(optimizer)
    events: list[tuple[int, str, int, Loc | None]] = field(default_factory=list)  # (call, kind, id(opt), line)
    # id(param) -> the backward() line that added to a gradient its optimizer's step() had used, when the next step()
    # of that optimizer then used the sum (nothing cleared it in between)
    stale: dict[int, Loc | None] = field(default_factory=dict)
    reached: dict[int, set[int]] = field(default_factory=dict)  # id(param) -> calls where a nonzero gradient arrived
    reached_at: dict[int, Loc | None] = field(default_factory=dict)  # id(param) -> the backward() line that reached it


class OwnersWatch:
    """Records, during audit_training's calls, each live optimizer's step() and zero_grad() and, through a gradient
    hook on each of their parameters, the gradient each backward() brings and the .grad it adds to."""

    def __init__(self, model: nn.Module, optimizer: Any, record: Any, user: UserCode, train_step: bool) -> None:
        self.user = user
        self.hooked_steps = True  # False: the caller reports each step (script mode: from inside its own step hook)
        live = live_optimizers(optimizer, record, model) if record is not None and train_step else []
        self.facts = OwnerFacts(live=live if len(live) > 1 else [])
        self.consumed: set[int] = set()  # parameters whose current .grad a step() of their optimizer has used
        self.pending: dict[int, Loc | None] = {}  # ... and that a backward() (this line) added to before any clearing
        self.call = -1
        self._handles: list[Any] = []
        if self.facts.live:
            self.facts.sites = {id(o): (record.optimizer_sites.get(id(o)) or (0, None))[1] for o in self.facts.live}
            self.facts.names = {pid: ns[0] for pid, ns in param_names(model).items()}
            self.facts.owner = {id(p): id(o) for o in self.facts.live for g in o.param_groups for p in g["params"]}

    @classmethod
    def for_script(cls, live: list[Any], names: dict[int, str], sites: dict[int, Loc | None], user: UserCode) -> OwnersWatch:
        """The watch over a script's own optimizers (those alive at its main optimizer's first step): its step()s are
        reported by the caller (`step_seen`), from inside the step hook that is running."""
        watch = cls.__new__(cls)
        watch.user, watch.hooked_steps = user, False
        watch.facts = OwnerFacts(live=live if len(live) > 1 else [], sites=sites, names=names)
        watch.facts.owner = {id(p): id(o) for o in watch.facts.live for g in o.param_groups for p in g["params"]}
        watch.consumed, watch.pending, watch.call, watch._handles = set(), {}, -1, []
        return watch

    def step_seen(self, opt: Any) -> None:
        """A step() of `opt` is about to run (script mode)."""
        self._pre_step(opt, (), {})

    def _hook(self, p: torch.Tensor) -> Any:
        pid = id(p)

        def seen(grad: torch.Tensor) -> None:
            prior = p.grad
            where = self.user.innermost(skip=2)
            if prior is None or not bool(prior.detach().abs().sum() > 0):  # cleared since (any way: zero_grad, = None)
                self.consumed.discard(pid)
                self.pending.pop(pid, None)
            elif pid in self.consumed:  # adds onto a gradient a step() already used
                self.pending.setdefault(pid, where)
            if bool(grad.detach().abs().sum() > 0):
                self.facts.reached.setdefault(pid, set()).add(self.call)
                self.facts.reached_at.setdefault(pid, where)

        return seen

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if any(opt is o for o in self.facts.live):
            self.facts.events.append((self.call, "step", id(opt), self.user.innermost(skip=2)))
            held = {id(p) for g in opt.param_groups for p in g["params"]}
            for pid in held & set(self.pending):  # this step() uses a gradient its previous step() had used
                self.facts.stale.setdefault(pid, self.pending.pop(pid))
            self.consumed |= {id(p) for g in opt.param_groups for p in g["params"] if p.grad is not None}

    def _wrap_zero_grad(self, opt: Any) -> None:
        orig = opt.zero_grad

        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            self.facts.events.append((self.call, "zero_grad", id(opt), self.user.innermost(skip=2)))
            return orig(*args, **kwargs)

        opt.zero_grad = zero_grad

    def __enter__(self) -> OwnersWatch:
        if not self.facts.live:
            return self
        if self.hooked_steps:
            self._handles.append(register_optimizer_step_pre_hook(self._pre_step))
        for o in self.facts.live:
            self._wrap_zero_grad(o)
            for g in o.param_groups:
                for p in g["params"]:
                    if isinstance(p, torch.Tensor) and p.requires_grad:
                        self._handles.append(p.register_hook(self._hook(p)))
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        for h in self._handles:
            h.remove()
        self._handles = []
        for o in self.facts.live:
            vars(o).pop("zero_grad", None)
        self.facts.calls = self.call + 1
        return False

    def findings(self) -> list[Finding]:
        return run_rules((GP212, GP213), self.facts)

    def measured_accumulation(self) -> bool | None:
        """With several optimizers, whether any optimizer's step() used a gradient its previous step() had used (None:
        not measured, one optimizer): GP602's single-optimizer reading does not apply to a GAN's loop otherwise."""
        return bool(self.facts.stale) if self.facts.live else None


def _at(loc: Loc | None) -> str:
    return line_of(loc) if loc else "an unrecorded line"


def _kind(facts: OwnerFacts, opt: int, kind: str) -> list[tuple[int, str, int, Loc | None]]:
    return [e for e in facts.events if e[2] == opt and e[1] == kind]


def _rezeroed_after_own_step(facts: OwnerFacts, other: int) -> Loc | None:
    """A zero_grad() of `other` that ran after `other`'s own step() in the same call: the line meant for another."""
    stepped: set[int] = set()  # the calls in which `other` has stepped so far
    for call, kind, opt, loc in facts.events:
        if opt != other:
            continue
        if kind == "step":
            stepped.add(call)
        elif call in stepped:
            return loc
    return None


def _names(facts: OwnerFacts, pids: list[int]) -> str:
    ns = [facts.names.get(p, "<tensor>") for p in pids]
    return ", ".join(ns[:6]) + ("..." if len(ns) > 6 else "")


def _type(facts: OwnerFacts, oid: int) -> str:
    return next(type(o).__name__ for o in facts.live if id(o) == oid)


@GP212.detector
def detect_wrong_zero_grad(facts: OwnerFacts) -> Iterator[Finding]:
    for o in facts.live:
        oid = id(o)
        stale = [pid for pid, own in facts.owner.items() if own == oid and pid in facts.stale]
        steps = _kind(facts, oid, "step")
        if not stale or not steps or _kind(facts, oid, "zero_grad"):
            continue
        for other in (id(x) for x in facts.live if x is not o):
            zero_at = _rezeroed_after_own_step(facts, other)
            if zero_at is None:
                continue
            other_step = _kind(facts, other, "step")
            backward_at = facts.stale[stale[0]]
            yield GP212.finding(
                parameters=[facts.names.get(p, "<tensor>") for p in stale], location=zero_at,
                evidence={"optimizer_built_at": facts.sites.get(oid), "other_built_at": facts.sites.get(other),
                          "stale_at_backward": backward_at, "calls": facts.calls},
                count=len(stale), optimizer=type(o).__name__, built_at=_at(facts.sites.get(oid)), step_at=_at(steps[0][3]),
                backward_at=_at(backward_at), names=_names(facts, stale), calls=facts.calls, zero_at=_at(zero_at),
                other=_type(facts, other), other_at=_at(facts.sites.get(other)),
                other_step_at=_at(other_step[0][3] if other_step else None))
            break


@GP213.detector
def detect_never_stepped(facts: OwnerFacts) -> Iterator[Finding]:
    if facts.calls < 2:
        return
    for o in facts.live:
        oid = id(o)
        if _kind(facts, oid, "step"):
            continue
        fed = [pid for pid, own in facts.owner.items() if own == oid and len(facts.reached.get(pid, ())) == facts.calls]
        stepped = [e for e in facts.events if e[1] == "step" and e[2] != oid]
        if not fed or not stepped:
            continue
        backward_at = facts.reached_at.get(fed[0])
        yield GP213.finding(
            parameters=[facts.names.get(p, "<tensor>") for p in fed], location=backward_at,
            evidence={"optimizer_built_at": facts.sites.get(oid), "other_step_at": stepped[0][3], "calls": facts.calls},
            optimizer=type(o).__name__, built_at=_at(facts.sites.get(oid)), count=len(fed), backward_at=_at(backward_at),
            calls=facts.calls, names=_names(facts, fed), other=_type(facts, stepped[0][2]), other_step_at=_at(stepped[0][3]))
