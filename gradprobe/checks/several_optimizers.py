"""GP210: several optimizers over the same parameters. Which optimizer owns which parameters, and which lines built them.

Every optimizer the user's build created is in the build record, with the line that built it. One that nothing holds any
more (built, then replaced by another) is left out: only optimizers the target still holds are compared, by tensor
identity.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks._step import param_names
from gradprobe.findings import Finding, Rule, run_rules

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


def held_by_others(optimizer: Any, record: BuildRecord | None) -> set[int]:
    """id() of the tensors that another optimizer the target still holds updates (a GAN's discriminator optimizer)."""
    if record is None:
        return set()
    return {id(t) for o in _live(optimizer, record) if o is not optimizer for g in o.param_groups for t in g["params"]}


def measure_shared(model: nn.Module, optimizer: Any, record: BuildRecord | None) -> SharedFacts:
    facts = SharedFacts()
    if record is None:
        return facts
    live = _live(optimizer, record)
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
