"""GP210: several optimizers over the same parameters. Which optimizer owns which parameters, and which lines built them.

Every optimizer the user's build created is in the build record, with the line that built it. One that nothing holds any
more (built, then replaced by another) is left out: only optimizers the target still holds are compared, by tensor
identity.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gradprobe.checks.core.step import param_names
from gradprobe.findings import Finding, Rule, run_rules
from gradprobe.userframes import UserCode

if TYPE_CHECKING:
    from gradprobe.loading import BuildRecord

Loc = dict[str, Any]

GP210: Rule[SharedFacts] = Rule(
    code="GP210", name="optimizers-share-parameters", severity="error", rank=15,
    summary="Two optimizers hold the same parameters.",
    why="Each optimizer's step() updates them with its own learning rate and state (momentum, Adam moments): the "
        "parameters move twice per iteration, or are moved by the optimizer meant for the other network (a GAN's "
        "generator stepped by the discriminator's optimizer).",
    example="opt_g = Adam(model.parameters()); opt_d = Adam(model.discriminator.parameters())",
    message="{count} parameter(s) are held by two optimizers, {first} built at {first_at} and {second} built at "
            "{second_at}: {names}. Each one's step() updates them.",
    fix="Give each optimizer only its own network's parameters: the {first} at {first_at} and the {second} at "
        "{second_at} must hold disjoint sets (e.g. model.generator.parameters() for one and "
        "model.discriminator.parameters() for the other, not model.parameters()).",
)

GP211: Rule[StepOwners] = Rule(
    code="GP211", name="step-on-wrong-optimizer", severity="error", rank=16,
    summary="An optimizer's step() ran while none of its parameters had a gradient, and another optimizer's did.",
    why="With several optimizers (GAN, actor-critic), stepping the one whose network the last backward() did not reach "
        "updates nothing, while the network that got the gradients is not updated by that step.",
    example="d_loss.backward(); opt_g.step()  # meant opt_d.step()",
    message="{optimizer} (built at {built_at}) stepped at {step_at} while none of its {count} parameter(s) had a "
            "gradient; {other} (built at {other_at}) held the {waiting} parameter(s) that did: {names}.",
    fix="Step the optimizer that owns the parameters the preceding backward() reached: call {other}'s step() at "
        "{step_at} (the one built at {other_at}), not the one built at {built_at}.",
)


@dataclass
class SharedFacts:
    """Pairs of live optimizers and the parameters both hold."""

    pairs: list[dict[str, Any]] = field(default_factory=list)


def _at(loc: Loc | None) -> str:
    return f"line {loc['line']} of {loc['file'].rsplit('/', 1)[-1]}" if loc else "an unrecorded line"


def _held(opt: torch.optim.Optimizer, record: BuildRecord) -> bool:
    """Whether anything but the build record (and the schedulers it records) still holds `opt`."""
    sched_dicts = [vars(s) for s, _ in getattr(record.group_sources, "schedulers", [])]
    returned = getattr(record.group_sources, "returned", None)
    for ref in gc.get_referrers(opt):
        if ref is record.keep or ref is returned or any(ref is d for d in sched_dicts) or type(ref).__name__ == "frame":
            continue
        return True
    return False


def _live(optimizer: Any, record: BuildRecord) -> list[torch.optim.Optimizer]:
    opts = list({id(o): o for o in record.keep if isinstance(o, torch.optim.Optimizer)}.values())
    returned = getattr(record.group_sources, "returned", [])
    live = [o for o in opts if o is optimizer or any(o is r for r in returned) or _held(o, record)]
    return sorted(live, key=lambda o: (record.optimizer_sites.get(id(o)) or (0, None))[0])


def _held_by_model(opt: torch.optim.Optimizer, model: nn.Module) -> bool:
    """Whether the model holds `opt`: a module's attribute, or an item of a list, tuple or dict a module holds."""
    attrs = {id(vars(m)) for m in model.modules()}
    containers = {id(v) for m in model.modules() for v in vars(m).values() if isinstance(v, (list, tuple, dict))}
    return any(id(ref) in attrs or id(ref) in containers for ref in gc.get_referrers(opt))


def held_by_others(optimizer: Any, record: BuildRecord | None) -> set[int]:
    """id() of the tensors that another optimizer the target still holds updates (a GAN's discriminator optimizer)."""
    if record is None:
        return set()
    return {id(t) for o in _live(optimizer, record) if o is not optimizer for g in o.param_groups for t in g["params"]}


def live_optimizers(optimizer: Any, record: BuildRecord, model: nn.Module) -> list[torch.optim.Optimizer]:
    """The optimizers that belong to the training: the one in use, one make_optimizer returned, one the model holds
    (a GAN's second optimizer), or one a script's own loop stepped; a leftover a script or setup keeps in a variable is
    not one."""
    returned = [*getattr(record.group_sources, "returned", []), *getattr(record, "stepped", [])]
    return [o for o in _live(optimizer, record)
            if o is optimizer or any(o is r for r in returned) or _held_by_model(o, model)]


def measure_shared(model: nn.Module, optimizer: Any, record: BuildRecord | None) -> SharedFacts:
    facts = SharedFacts()
    if record is None:
        return facts
    # an error needs both optimizers to belong to the training (a leftover in a variable is not compared)
    live = live_optimizers(optimizer, record, model)
    if len(live) < 2:
        return facts
    names = param_names(model)
    sites = {id(o): record.optimizer_sites.get(id(o), (None, None)) for o in live}
    for i, a in enumerate(live):
        held = {id(t) for g in a.param_groups for t in g["params"]}
        for b in live[i + 1:]:
            both = [t for g in b.param_groups for t in g["params"] if id(t) in held]
            if both:
                facts.pairs.append({"first": a, "second": b, "first_at": sites[id(a)][1], "second_at": sites[id(b)][1],
                                    "shared": [names.get(id(t), [f"<tensor {tuple(t.shape)}>"])[0] for t in both]})
    return facts


@GP210.detector
def detect_shared(facts: SharedFacts) -> Iterator[Finding]:
    for pair in facts.pairs:
        shared, first, second = pair["shared"], type(pair["first"]).__name__, type(pair["second"]).__name__
        names = f"{', '.join(shared[:6])}{'...' if len(shared) > 6 else ''}"
        yield GP210.finding(count=len(shared), first=first, second=second, first_at=_at(pair["first_at"]),
                            second_at=_at(pair["second_at"]), names=names, parameters=shared,
                            location=pair["second_at"] or pair["first_at"],
                            evidence={"first_optimizer_at": pair["first_at"], "second_optimizer_at": pair["second_at"],
                                      "shared": len(shared)})


def shared_parameter_findings(model: nn.Module, optimizer: Any, record: BuildRecord | None) -> list[Finding]:
    """GP210 for every pair of optimizers, built by the target and still held, over the same parameters."""
    return run_rules((GP210,), measure_shared(model, optimizer, record))


@dataclass
class StepFacts:
    """Each step() of the target's optimizers during one measured step: which optimizer, its line, what had gradients."""

    wrong: list[dict[str, Any]] = field(default_factory=list)


def _has_grad(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for g in opt.param_groups for t in g["params"] if t.grad is not None and bool(t.grad.detach().abs().sum() > 0)]


class StepOwners:
    """While a step runs, notes each step() of the live optimizers: wrong when its own parameters had no gradient and
    another live optimizer's had."""

    def __init__(self, model: nn.Module, optimizer: Any, record: BuildRecord | None, user: UserCode) -> None:
        self.model, self.user = model, user
        self.live = _live(optimizer, record) if record is not None else []
        self.sites = {id(o): (record.optimizer_sites.get(id(o)) or (0, None))[1] for o in self.live} if record else {}
        self.facts = StepFacts()

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not any(opt is o for o in self.live) or _has_grad(opt):
            return
        for other in self.live:
            waiting = _has_grad(other) if other is not opt else []
            if waiting:
                names = param_names(self.model)
                self.facts.wrong.append({
                    "optimizer": opt, "other": other, "step_at": self.user.innermost(skip=2),
                    "count": sum(len(g["params"]) for g in opt.param_groups),
                    "waiting": [names.get(id(t), [f"<tensor {tuple(t.shape)}>"])[0] for t in waiting]})
                return

    def __enter__(self) -> StepOwners:
        self._handle = register_optimizer_step_pre_hook(self._pre_step) if len(self.live) > 1 else None
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self._handle is not None:
            self._handle.remove()
        return False

    def findings(self) -> list[Finding]:
        return run_rules((GP211,), self)


@GP211.detector
def detect_wrong_step(owners: StepOwners) -> Iterator[Finding]:
    for w in owners.facts.wrong:
        opt, other, waiting = w["optimizer"], w["other"], w["waiting"]
        yield GP211.finding(optimizer=type(opt).__name__, built_at=_at(owners.sites.get(id(opt))), step_at=_at(w["step_at"]),
                            count=w["count"], other=type(other).__name__, other_at=_at(owners.sites.get(id(other))),
                            waiting=len(waiting), names=", ".join(waiting[:6]) + ("..." if len(waiting) > 6 else ""),
                            parameters=waiting, location=w["step_at"],
                            evidence={"stepped_optimizer_at": owners.sites.get(id(opt)),
                                      "owner_optimizer_at": owners.sites.get(id(other))})


def wrong_step_parameters(findings: list[Finding]) -> set[str]:
    """The parameters a GP211 finding already explains (their owner was not stepped): not GP207 again."""
    return {n for f in findings if f["code"] == GP211.code for n in f["parameters"]}
