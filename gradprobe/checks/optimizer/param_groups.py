"""GP204 and GP205: what the optimizer's param groups hold and the learning rate each one gets, and where the user's
code decided it (the function and line that built a group, the scheduler lambda that set its lr).

The facts of one optimizer's groups (`CoverageFacts`, filled by checks/optimizer/engine.py's `measure_coverage`) and the
two rules that read a group's contents and hyperparameters; checks/optimizer/group_sources.py records where groups came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from gradprobe.checks.optimizer.group_sources import GroupSources, LrSource, scheduler_source
from gradprobe.findings import Finding, Rule, Situation
from gradprobe.userframes import UserCode, statement_start

Loc = dict[str, Any]

GP204: Rule[CoverageFacts] = Rule(
    code="GP204", name="duplicate-param-in-optimizer", severity="error", rank=14,
    summary="One parameter in several param groups.",
    why="Recent PyTorch refuses it; older versions update the tensor twice per step with different hyperparameters.",
    example="Adam([{'params': model.parameters()}, {'params': model.head.parameters(), 'lr': 1e-2}])",
    message="{count} parameter(s) appear in more than one param group.",
    fix="Partition the parameters so each appears in exactly one group.",
    situations={
        "refused": Situation(
            when="torch refused to build the optimizer for it",
            message="make_optimizer failed: {error}. A parameter appears in several param groups."),
        "refused_named": Situation(
            when="torch refused to build the optimizer for it, and the parameters and the lines that built both groups "
                 "were recorded",
            message="make_optimizer failed: {error}. {count} parameter(s) are in both param group {first} (built at "
                    "{first_at}) and param group {second} (built at {second_at}): {names}.",
            fix="Build param group {second} ({second_at}) from the parameters group {first} does not already hold: "
                "taken = {{id(p) for p in <group {first}'s params>}}; [p for p in <group {second}'s params> if id(p) not "
                "in taken] (or narrow group {first} to the rest of the model)."),
    },
)

GP205: Rule[CoverageFacts] = Rule(
    code="GP205", name="zero-learning-rate", severity="warning", rank=99,
    summary="A param group with lr == 0.",
    why="Its parameters get gradients but never move.",
    example="{'params': model.encoder.parameters(), 'lr': 0.0}",
    message="param group {group} has lr=0: its {count} tensors never move.",
    fix="Give the group a positive lr, or freeze those parameters explicitly with requires_grad_(False).",
    situations={
        "warmup_unjudged": Situation(
            when="a script's first optimizer step ran at lr 0 in every group (a warm-up from 0), and no later step was reached",
            severity="info",  # expected of a warm-up from 0: information, not the catalogue's warning
            message="The script's first optimizer step ran with learning rate 0 in every param group ({lrs}), typically a "
                    "scheduler warming up from 0: that step moves nothing, as expected; no later step with a nonzero "
                    "learning rate was reached, so updates were not judged.",
            fix="Nothing to fix if a warm-up schedule starts at 0; to judge updates, let the script run past the first step."),
        "warmup_judged": Situation(
            when="a script's first optimizer step ran at lr 0 in every group, and updates were judged on a later step",
            severity="info",
            message="The script's first optimizer step ran with learning rate 0 in every param group ({lrs}), typically a "
                    "scheduler warming up from 0: that step moves nothing, as expected; updates were judged on a later "
                    "step (learning rates {judged_on}).",
            fix="Nothing to fix if a warm-up schedule starts at 0; updates were judged on the later step."),
        "built": Situation(
            when="the group was built, with lr 0, by a user function other than the optimizer's own statement (a "
                 "layer-wise decay helper)",
            message="param group {group} has lr=0: its {count} tensors ({names}) never move. The group was built by "
                    "{function}() at line {line} of {file}, which gave it lr 0.",
            fix="Fix the lr that {function}() computes at line {line} of {file} for this group (a layer-decay scale or "
                "exponent that reaches 0 for these layers); if they are meant to stay fixed, freeze them with "
                "requires_grad_(False) instead."),
        "decay_function": Situation(
            when="the group's lr is computed by calling a user function (a layer-wise decay helper) that returned 0 for "
                 "it: the finding points at that function's return",
            message="param group {group} has lr=0: its {count} tensors ({names}) never move. Its lr is computed at line "
                    "{called_line} by calling {function}(), which returned 0 at line {line} of {file}.",
            fix="Make {function}() (line {line} of {file}) return a positive factor for these layers too: a decay that "
                "cannot reach 0 (e.g. decay ** depth with 0 < decay < 1) instead of a branch or a linear scale that gives "
                "0 at the deepest layer; if they are meant to stay fixed, freeze them with requires_grad_(False) instead."),
        "scheduler_stays": Situation(
            when="a LambdaLR-style scheduler's lambda returns 0 at step 0 and at every later step probed",
            message="param group {group} has lr=0: its {count} tensors ({names}) never move. Its base lr is {initial_lr}, "
                    "but the {scheduler} lambda at line {line} of {file} returns 0 at step 0 and still {later}.",
            fix="Make the lambda at line {line} of {file} return a positive factor for this group ({scheduler} multiplies "
                "the base lr by it), e.g. a warm-up that rises: lambda step: min(1.0, (step + 1) / warmup_steps)."),
        "scheduler_rises": Situation(
            when="a scheduler's lambda returns 0 at step 0 and rises later (a warm-up from 0)",
            severity="info",
            message="param group {group} starts at lr=0 (base lr {initial_lr}): the {scheduler} lambda at line {line} of "
                    "{file} returns 0 at step 0 and {later}: a warm-up from 0, its first step moves nothing.",
            fix="Nothing to fix if the warm-up from 0 is intended; to move from the first step, start the factor above 0 "
                "(e.g. (step + 1) / warmup_steps)."),
        "scheduled": Situation(
            when="a scheduler (not a lambda that can be probed) set the group's lr to 0 at step 0",
            message="param group {group} has lr=0 at step 0: its {count} tensors ({names}) do not move. Its base lr is "
                    "{initial_lr}; the {scheduler} built at line {line} of {file} set it to 0.",
            fix="Check the {scheduler} built at line {line} of {file}: its factor at step 0 is 0 for this group; if that "
                "is not a warm-up, give it a positive start factor."),
    },
)

@dataclass
class CoverageFacts:
    """The optimizer's param groups compared, by identity, with the model's parameters."""

    kind: str  # the optimizer's class name
    site: Loc | None  # where the user built it
    groups: list[dict[str, Any]] = field(default_factory=list)  # one row per param group (the report's facts)
    zero_lr: list[tuple[int, int, list[str]]] = field(default_factory=list)  # (group, tensors, names) with lr == 0
    total: int = 0  # tensors in all groups
    trainable: int = 0  # the model's trainable parameters
    dupes: list[tuple[str, int, int]] = field(default_factory=list)  # (name, first group, other group)
    stale: list[dict[str, Any]] = field(default_factory=list)  # tensors not in the model: shape and what they likely were
    replaced: list[str] = field(default_factory=list)  # the parameters the stale tensors were
    replaced_at: Loc | None = None
    missing: list[str] = field(default_factory=list)  # trainable parameters in no group, all of them
    rest: list[tuple[str, int]] = field(default_factory=list)  # ... those the stale tensors do not explain (name, numel)
    added_at: Loc | None = None  # where `rest` was set on the model after the optimizer, in the function that built it
    frozen: list[str] = field(default_factory=list)
    frozen_at: Loc | None = None
    nonleaf: list[str] = field(default_factory=list)
    during_step: bool = False  # measured again after a step that replaced parameters
    sharded: bool = False  # the stale tensors are plain, the parameters they were DTensors (fully_shard, parallelize_module)
    lr_sources: dict[int, LrSource] = field(default_factory=dict)  # group -> why its lr is 0, where known
    members: list[str] = field(default_factory=list)  # several models checked as one (a ModelSet): the script's names


def scan_groups(facts: CoverageFacts, optimizer: torch.optim.Optimizer, names: dict[int, list[str]],
                 seen: dict[int, int]) -> list[torch.Tensor]:
    """Walk the param groups once: group rows, zero lr, duplicates, frozen and non-leaf tensors; return the stale ones."""
    stale: list[torch.Tensor] = []
    for gi, group in enumerate(optimizer.param_groups):
        gnames = []
        for t in group["params"]:
            n = names.get(id(t), [None])[0]
            gnames.append(n or f"<tensor {tuple(t.shape)} not in the model>")
            if id(t) in seen and seen[id(t)] != gi:
                facts.dupes.append((n or str(tuple(t.shape)), seen[id(t)], gi))
            seen.setdefault(id(t), gi)
            if n is None:
                stale.append(t)
            elif not t.requires_grad:
                facts.frozen.append(n)
            if not t.is_leaf:
                facts.nonleaf.append(n or str(tuple(t.shape)))
        facts.groups.append({"index": gi, "lr": group.get("lr"), "weight_decay": group.get("weight_decay"),
                             "tensors": len(group["params"]), "names": gnames})
        if group.get("lr") == 0:
            facts.zero_lr.append((gi, len(group["params"]), [g for g in gnames if not g.startswith("<")]))
    return stale



ZERO_LR_RULES = (GP205,)
DUPLICATE_RULES = (GP204,)


def _names(names: list[str], n: int = 6) -> str:
    return f"{', '.join(names[:n])}{'...' if len(names) > n else ''}"


def _where(loc: Loc | None) -> dict[str, Any]:
    return {"line": loc["line"], "file": loc["file"].rsplit("/", 1)[-1]} if loc else {}


def _same_statement(loc: Loc | None, site: Loc | None) -> bool:
    return bool(loc and site and loc["file"] == site["file"]
                and statement_start(loc["file"], loc["line"]) == statement_start(site["file"], site["line"]))


def group_lr_sources(facts: CoverageFacts, optimizer: torch.optim.Optimizer, sources: GroupSources | None) -> None:
    """Why each zero-lr group has lr 0: the scheduler that set it, else the user function that built the group (when
    that is not the optimizer's own statement, whose line the finding already names)."""
    for gi, _, _ in facts.zero_lr:
        found = scheduler_source(sources, optimizer, gi)
        if found is None and sources is not None:
            built = sources.source_of(optimizer.param_groups[gi])
            callee = sources.zero_lr_callee(built) if built is not None else None
            if built is not None and callee is not None:
                found = LrSource("decay_function", callee[1], {"called_at": built, "returned_by": callee[0]})
            elif built is not None and not _same_statement(built, facts.site):
                found = LrSource("built", built)
        if found is not None:
            facts.lr_sources[gi] = found


def _later(detail: dict[str, Any]) -> str:
    steps = detail.get("factor_at_step") or []
    return ", ".join(f"{v:g} at step {k}" for k, v in steps) or "later"


@GP205.detector
def detect_zero_lr(facts: CoverageFacts) -> Iterator[Finding]:
    for gi, count, gnames in facts.zero_lr:
        src = facts.lr_sources.get(gi)
        evidence: dict[str, Any] = {"group": gi, "lr": 0}
        if src is None:
            yield GP205.finding(group=gi, count=count, parameters=gnames, location=facts.site, evidence=evidence)
            continue
        evidence.update(lr_source=src.kind, source_at=src.location, optimizer_created_at=facts.site, **src.detail)
        fields = {"function": (src.location or {}).get("function"), "initial_lr": src.detail.get("initial_lr"),
                  "called_line": (src.detail.get("called_at") or {}).get("line"),
                  "scheduler": src.detail.get("scheduler"), "later": _later(src.detail)}
        yield GP205.finding(src.kind, group=gi, count=count, names=_names(gnames), **fields, **_where(src.location),
                            parameters=gnames, location=src.location or facts.site, evidence=evidence)


@GP204.detector
def detect_duplicates(facts: CoverageFacts) -> Iterator[Finding]:
    if facts.dupes:
        yield GP204.finding(count=len(facts.dupes), parameters=[d[0] for d in facts.dupes], location=facts.site,
                            evidence={"duplicates": [{"name": d[0], "groups": [d[1], d[2]]} for d in facts.dupes]})


def zero_lr_explained(coverage: list[Finding]) -> tuple[set[str], Loc | None]:
    """The parameters a warm-up from 0 keeps still on its first step (by design), and the line that gave a group lr 0
    (its builder or its scheduler's lambda) where one was found."""
    zero_lr = [f for f in coverage if f["code"] == GP205.code]
    warmup = {n for f in zero_lr if f["evidence"].get("lr_source") == "scheduler_rises" for n in f["parameters"]}
    at = next((f["location"] for f in zero_lr if f["evidence"].get("lr_source") not in (None, "scheduler_rises")), None)
    return warmup, cast(Loc | None, at)


def first_step_lr_zero_finding(lrs: list[Any], location: Loc | None, judged_on: list[Any] | None) -> Finding:
    """Script mode: the first optimizer step ran at lr 0 everywhere (a warm-up from 0): info, not a warning.
    With `judged_on` (the lrs of a later step that was checked), updates were judged there."""
    return GP205.finding("warmup_unjudged" if judged_on is None else "warmup_judged", lrs=lrs, judged_on=judged_on,
                         location=location, evidence={"learning_rates": lrs, "first_step_lr_zero": True})


def _at(loc: Loc | None) -> str:
    return f"line {loc['line']} of {loc['file'].rsplit('/', 1)[-1]} in {loc['function']}()" if loc else "an unrecorded line"


def refused_duplicates(text: str, sources: GroupSources | None, names: dict[int, list[str]], fallback: Loc | None,
                       user: UserCode) -> Finding:
    """torch refused a group holding parameters an earlier group holds: which parameters, which groups, which lines."""
    refused = sources.refused if sources is not None else None
    if sources is None or refused is None:
        return GP204.finding("refused", error=text, location=fallback, evidence={"error": text})
    before, group = refused
    owner = {id(t): gi for gi, g in enumerate(before) for t in g["params"]}
    params = group["params"] if isinstance(group["params"], list) else []
    both = [t for t in params if isinstance(t, torch.Tensor) and id(t) in owner]
    first, second = (owner[id(both[0])] if both else 0), len(before)
    dup = [names.get(id(t), [f"<tensor {tuple(t.shape)}>"])[0] for t in both if owner[id(t)] == first]
    first_at, second_at = sources.source_of(before[first]) if before else None, sources.source_of(group)
    evidence = {"error": text, "duplicates": dup, "groups": [first, second],
                "group_built_at": {str(first): first_at, str(second): second_at}}
    return GP204.finding("refused_named", error=text, count=len(dup), names=_names(dup), first=first, second=second,
                         first_at=_at(first_at), second_at=_at(second_at), parameters=dup,
                         location=second_at or fallback, evidence=evidence)
