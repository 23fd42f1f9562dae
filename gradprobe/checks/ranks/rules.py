"""Checks across the ranks of one script run (world_size > 1, or workers the script spawned): what each rank measured
before and at its first optimizer step (gradprobe/scriptmode/rankwatch.py), compared across ranks.

- GP703 a parameter that took part in the loss on some ranks only (the user's line that called it on those ranks);
- GP704 parameters that differ across ranks, or will after the step: the first one named, with the measured cause
  and its line (the ranks started from different weights: the line that built the parameter, when its checksums
  already differed at the first forward; their gradients differ because nothing averaged them: the script's own
  all-reduce; DDP's `no_sync()` was still in force at the step: the `with model.no_sync():` line; under FSDP2, whose
  fully_shard broadcasts nothing, the whole values each rank built differed when fully_shard took them: the line
  that built the parameter);
- GP705 gradients all-reduced with SUM and not divided by the world size (the all-reduced gradient equals the sum of
  the ranks' gradients measured before the all-reduce);
- GP706 a rank waiting in a collective the others never joined, until the script's share of the call's timeout;
- GP707 a rank whose step was not checked (its checks did not finish in time, or it ended without a report).

Written from public reports: a rank-dependent branch that leaves parameters out of the loss
(https://github.com/Yuanhy1997/SeqDiffuSeq/issues/25), a seed per rank before the model is built
(https://github.com/facebookresearch/detr/issues/544), gradients synced while parameters were never broadcast
(https://github.com/horovod/horovod/issues/672), an all-reduce sum left undivided
(https://github.com/hpcaitech/ColossalAI/issues/3044), a collective called on one rank only
(https://github.com/pytorch/pytorch/issues/54059), a model seeded per rank before fully_shard
(https://github.com/pytorch/torchtitan/issues/1777).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gradprobe.findings import Finding, Rule, Situation

REL_TOL = 1e-5


@dataclass
class StuckRank:
    """A rank that reached no step by the deadline: what its stack showed."""

    rank: int
    collective: str | None
    location: dict[str, Any] | None
    stack: str = ""


@dataclass
class RankFacts:
    world_size: int
    observations: dict[int, dict[str, Any]]  # rank -> its first step's snapshot (obs<i>.json)
    used: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> what took part in its loss (pre<i>.json)
    stuck: list[StuckRank] = field(default_factory=list)
    reached: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # rank -> its step's line
    unfinished: list[int] = field(default_factory=list)  # ranks that stepped but whose checks did not end in time
    exited: dict[int, int] = field(default_factory=dict)  # rank -> exit status, for ranks that ended without a report


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _names(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _line(loc: dict[str, Any] | None) -> str:
    return f"line {loc['line']} of {os.path.basename(str(loc['file']))}" if loc else "an unknown line"


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-12)


GP703: Rule[RankFacts] = Rule(
    code="GP703", name="unused-on-some-ranks", severity="error", rank=24,
    summary="A parameter took part in the loss on some ranks and not on others before the first optimizer step.",
    why="DDP expects every rank to produce a gradient for the same parameters: a parameter skipped by a rank-dependent "
        "branch (or a data-dependent one that went differently on each rank) leaves its gradient bucket unreduced on "
        "that rank, so the other ranks wait in the backward's all-reduce or the next iteration raises \"Expected to have "
        "finished reduction in the prior iteration\"; without DDP the ranks' gradients simply differ.",
    example="if rank == 0:\n    x = self.aux(x)   # self.aux's parameters get a gradient on rank 0 only",
    message="{count} parameter(s) ({names}) took part in the loss on rank(s) {used_on} but not on rank(s) {unused_on} "
            "before the first optimizer.step(): the call at {line} ran on rank(s) {used_on} only.",
    fix="Make every rank run the same modules (move the call at {line} out of the rank- or data-dependent branch, or "
        "multiply its output by 0 on the ranks that skip it so it stays in the graph); if skipping is intended, pass "
        "find_unused_parameters=True to DistributedDataParallel.",
    situations={
        "dropped": Situation(
            when="the module holding the parameters was called on every rank, and its output reached the loss on some "
                 "ranks only (a loss term, or a use of that output, that depends on the rank's data)",
            message="{count} parameter(s) ({names}) took part in the loss on rank(s) {used_on} but not on rank(s) "
                    "{unused_on} before the first optimizer.step(): the call at {line} ran on every rank, but its "
                    "output reached the loss on rank(s) {used_on} only.",
            fix="Keep the output of the call at {line} in the loss on every rank: where its loss term is skipped (no "
                "positive targets, an empty mask), add the output multiplied by zero instead (`loss = loss + 0 * "
                "out.sum()`) so that {names} get a gradient on every rank; if skipping is intended, pass "
                "find_unused_parameters=True to DistributedDataParallel."),
        "find_unused": Situation(
            when="DDP was built with find_unused_parameters=True (it reduces a zero gradient for the skipped ranks)",
            severity="info",
            fix="Nothing to fix if skipping {names} on some ranks is intended: DDP averages a zero gradient in for the "
                "ranks that skip it."),
    },
)


@GP703.detector
def detect_unused_on_some_ranks(facts: RankFacts) -> Iterator[Finding]:
    used = facts.used
    if len(used) < 2:
        return
    order = list(used[min(used)].get("params") or [])
    groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[str]] = {}
    for name in order:
        on = tuple(r for r in sorted(used) if name in (used[r].get("used") or {}))
        off = tuple(r for r in sorted(used) if name in (used[r].get("params") or []) and r not in on)
        if on and off:
            groups.setdefault((on, off), []).append(name)
    for (on, off), names in groups.items():
        site = next((used[r]["used"].get(n) for r in on for n in names if used[r]["used"].get(n)), None)
        find_unused = all(used[r].get("find_unused") for r in used) and any(used[r].get("ddp") for r in used)
        # called on the ranks that did not use them too: their output was left out of the loss there
        dropped = all(n in (used[r].get("called") or {}) for r in off for n in names)
        situation = "find_unused" if find_unused else "dropped" if dropped else None
        yield GP703.finding(situation, parameters=names, location=site,
                            evidence={"used_on": list(on), "unused_on": list(off), "ranks": list(off)},
                            count=len(names), names=_names(names), used_on=_ranks(list(on)),
                            unused_on=_ranks(list(off)), line=_line(site))


GP704: Rule[RankFacts] = Rule(
    code="GP704", name="ranks-diverge", severity="error", rank=22,
    summary="A parameter differs across ranks at the first optimizer step, or will after it (its gradient differs).",
    why="Data-parallel ranks must hold the same weights: they start equal only if the model is broadcast (DDP does it "
        "when it is built) or built from the same seed, and stay equal only if every rank steps with the same, "
        "averaged gradient. Ranks that drift apart train several different models while looking like one.",
    example="torch.manual_seed(rank); model = Net()   # and the gradients averaged by hand: no broadcast at start",
    message="{name} differed across ranks when the first optimizer.step() ran ({values}; {count} parameter(s) "
            "differ): the ranks started from different weights.",
    fix="Start every rank from the same weights: wrap the model in DistributedDataParallel (it broadcasts rank 0's "
        "weights when built), or broadcast them yourself (`for p in model.parameters(): dist.broadcast(p.data, 0)`), "
        "or seed identically before building the model.",
    situations={
        "after_wrap": Situation(
            when="DistributedDataParallel broadcast equal weights when it was built, and they differed across ranks "
                 "when the model was first called",
            message="{name} differed across ranks when the first optimizer.step() ran ({values}; {count} parameter(s) "
                    "differ), though DistributedDataParallel made it equal on every rank when it was built at "
                    "{wrap_line}: code between that line and the first forward changed it on some ranks only.",
            fix="Do what changes the weights (a checkpoint load, a re-initialisation) before wrapping the model in "
                "DistributedDataParallel at {wrap_line}, or on every rank; DDP broadcasts rank 0's weights only when "
                "it is built."),
        "shards_mixed": Situation(
            when="the model is sharded with FSDP2's fully_shard, and a parameter's whole value differed across ranks "
                 "just before fully_shard sharded it",
            message="{name} had a different value on each rank when fully_shard sharded it at {shard_line} ({values}; "
                    "{count} parameter(s) differ): fully_shard broadcasts nothing, each rank keeps its own slice of "
                    "what it built, so the model that trains is pieced together from the ranks' different "
                    "initialisations, a model no rank built (a seed that differs per rank, or a checkpoint loaded on "
                    "some ranks only, before this line).",
            fix="Build the model from the same seed on every rank (seed per rank only after fully_shard, for the data "
                "and dropout), or load the checkpoint on every rank before fully_shard, or after it with "
                "torch.distributed.checkpoint.state_dict.set_model_state_dict(model, state, "
                "options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))."),
        "changed": Situation(
            when="the weights were equal when the model was first called, and differed at the first optimizer.step()",
            message="{name} differed across ranks when the first optimizer.step() ran ({values}; {count} parameter(s) "
                    "differ), though it was equal on every rank when the model was first called: something between "
                    "the forward and the step changed it on some ranks only.",
            fix="Look between the forward and optimizer.step() for code that writes parameters on some ranks only (a "
                "rank- or data-dependent in-place update, a load on one rank), and make every rank do the same."),
        "not_averaged": Situation(
            when="the weights were equal but the gradients differ and nothing averaged them",
            message="{name} was equal on every rank at the first optimizer.step() but its gradient differed ({grads}; "
                    "{count} gradient(s) differ): nothing averaged the gradients, so the step moves the ranks apart.",
            fix="Average the gradients across ranks before optimizer.step(): wrap the model in "
                "DistributedDataParallel, or `dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)` for every parameter."),
        "not_sharded": Situation(
            when="the model is sharded with FSDP2's fully_shard, and the parameters whose gradients differ are plain "
                 "tensors no fully_shard call covers",
            message="{name} was equal on every rank at the first optimizer.step() but its gradient differed ({grads}; "
                    "{count} gradient(s) differ): it is a plain tensor beside the model's FSDP2-sharded parameters, in "
                    "no module that fully_shard was applied to, so nothing reduces its gradient and the step moves the "
                    "ranks apart.",
            fix="Apply fully_shard to the root module too, after its submodules (or to the module holding {name}), "
                "before building the optimizer, so that FSDP2 reduces every gradient."),
        "ddp_stalled": Situation(
            when="the model is wrapped in DistributedDataParallel (find_unused_parameters=False) and some of its "
                 "trainable parameters got no gradient in the backward",
            message="{name} was equal on every rank at the first optimizer.step() but its gradient differed ({grads}; "
                    "{count} gradient(s) differ): {stalled_count} trainable parameter(s) of the DistributedDataParallel "
                    "model ({stalled}) got no gradient in the backward, and DDP all-reduces a bucket only once every "
                    "parameter in it has one, so its gradient reduction never finished and the step moves the ranks "
                    "apart (the next iteration raises \"Expected to have finished reduction in the prior iteration\").",
            fix="Make {stalled} take part in the loss (see the finding that says why they get no gradient), or freeze "
                "them (requires_grad_(False)) before wrapping the model in DistributedDataParallel; if skipping them is "
                "intended, pass find_unused_parameters=True."),
        "ddp_stalled_by_gradprobe": Situation(
            when="gradprobe itself wrapped a plain model in DistributedDataParallel with its defaults (the "
                 "build_model() form), and the trainable parameters that got no gradient got none on any rank",
            severity="info",
            message="{name}'s gradient differed across ranks ({grads}; {count} gradient(s) differ) because "
                    "{stalled_count} trainable parameter(s) ({stalled}) got no gradient on any rank, and the "
                    "DistributedDataParallel(model) that gradprobe wrapped your model in (its defaults, "
                    "find_unused_parameters=False, as accelerate and Lightning wrap too) all-reduces a bucket only "
                    "once every parameter in it has one: wrapped so, a training script would raise \"Expected to "
                    "have finished reduction in the prior iteration\" at its second iteration. Your code did not "
                    "choose this wrap; it is what this model needs from one.",
            fix="When you wrap this model in DistributedDataParallel, pass find_unused_parameters=True (as transformers' "
                "Trainer does for its models), or freeze {stalled} (requires_grad_(False)) before wrapping; to check "
                "your own wrap, return the wrapped model from build_model()."),
        "no_sync": Situation(
            when="DistributedDataParallel's no_sync() was still in force when the optimizer stepped",
            message="{name} was equal on every rank at the first optimizer.step() but its gradient differed ({grads}; "
                    "{count} gradient(s) differ): DistributedDataParallel's gradient sync was off (inside no_sync()) "
                    "for the backward before this step, so the step moves the ranks apart.",
            fix="Leave no_sync() for the last micro-batch before optimizer.step() (run that backward outside the "
                "`with model.no_sync():` block) so DDP averages the accumulated gradients."),
    },
)


def _plain_rows(obs: dict[int, dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """name -> rank -> row, for parameters every stepped rank holds whole (not sharded DTensors)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in sorted(obs):
        for row in obs[r].get("params") or []:
            placements = row.get("placements")
            if placements and not all(p == "Replicate" for p in placements):
                continue
            out.setdefault(row["name"], {})[r] = row
    return {n: rows for n, rows in out.items() if len(rows) == len(obs)}


def _values(rows: dict[int, dict[str, Any]], key: str) -> str:
    return ", ".join(f"rank {r}: {rows[r][key]:.6g}" if rows[r][key] is not None else f"rank {r}: none" for r in rows)


def _differ(rows: dict[str, dict[int, dict[str, Any]]], key: str) -> list[str]:
    return [n for n, rr in rows.items() if not all(_close(rr[r][key], rr[min(rr)][key]) for r in rr)]


def _first_reduce(rows: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """The line of the script's own all-reduce of a gradient (the first parameter's that has one)."""
    return next((row["reduced"]["location"] for rr in rows.values() for row in rr.values()
                 if (row.get("reduced") or {}).get("location")), None)


def _shard_rows(obs: dict[int, dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """name -> rank -> row, for parameters every rank measured whole just before fully_shard sharded them."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in sorted(obs):
        for row in obs[r].get("params") or []:
            if row.get("at_shard") is not None:
                out.setdefault(row["name"], {})[r] = row
    return {n: rows for n, rows in out.items() if len(rows) == len(obs)}


def _shards_mixed(obs: dict[int, dict[str, Any]]) -> Iterator[Finding]:
    """FSDP2: parameters whose whole values differed across ranks when fully_shard sharded them (at their build line)."""
    rows = _shard_rows(obs)
    differ = _differ(rows, "at_shard")
    if not differ:
        return
    name, first = differ[0], obs[min(obs)]
    rr = rows[name]
    shard_line = _line(rr[min(rr)].get("sharded_by"))
    evidence = {"ranks": sorted(obs), "at_fully_shard": {str(r): rr[r]["at_shard"] for r in rr},
                "built_at": rr[min(rr)].get("built"), "sharded_by": rr[min(rr)].get("sharded_by")}
    yield GP704.finding("shards_mixed", parameters=differ, location=rr[min(rr)].get("built") or first.get("step_location"),
                        evidence=evidence, name=name, values=_values(rr, "at_shard"), count=len(differ),
                        shard_line=shard_line)


@GP704.detector
def detect_ranks_diverge(facts: RankFacts) -> Iterator[Finding]:
    """Where the first difference arose: the values at the first forward already differ (the line that built the
    parameter), they differ at the step only (the step), or the gradients differ (the script's all-reduce or the
    `with model.no_sync():` line, else the step)."""
    obs = facts.observations
    if len(obs) < 2:
        return
    mixed = list(_shards_mixed(obs))
    if mixed:
        yield from mixed
        return
    rows = _plain_rows(obs)
    first = obs[min(obs)]
    step = first.get("step_location")
    differ = _differ(rows, "value")
    if differ:
        name = differ[0]
        rr = rows[name]
        measured = all(rr[r].get("at_forward") is not None for r in rr)
        at_start = measured and name in _differ({name: rr}, "at_forward")
        # DDP broadcast rank 0's weights when it was built: equal then, a later line changed them on some ranks
        wrapped = all(rr[r].get("at_wrap") is not None for r in rr) and name not in _differ({name: rr}, "at_wrap")
        situation = ("after_wrap" if at_start and wrapped else None if at_start or not measured else "changed")
        wrap_loc = rr[min(rr)].get("wrapped_at")
        loc = {None: rr[min(rr)].get("built"), "after_wrap": wrap_loc, "changed": None}[situation] or step
        evidence = {"ranks": sorted(obs), "at_first_forward": {str(r): rr[r].get("at_forward") for r in rr},
                    "built_at": rr[min(rr)].get("built"), "step_location": step}
        yield GP704.finding(situation, parameters=differ, location=loc, evidence=evidence, name=name,
                            values=_values(rr, "value"), count=len(differ), wrap_line=_line(wrap_loc))
        return
    grads = _differ(rows, "grad")
    if not grads:
        return
    ddps = [d for o in obs.values() for d in o.get("ddp") or []]
    no_sync = any(not d.get("sync", True) for d in ddps)
    # DDP (find_unused_parameters=False) reduces a bucket once every parameter in it has a gradient
    stalled = [n for n, rr in rows.items() if any(rr[r].get("requires_grad") and rr[r]["grad"] is None for r in rr)]
    stalled = stalled if ddps and not any(d.get("find_unused") for d in ddps) else []
    sharded = first.get("sharded_at") or []  # plain parameters beside FSDP2's: no fully_shard covers them
    # gradprobe's own wrap, and parameters unused on every rank (the model's design, not a rank's data): its choice
    ours = stalled and all(d.get("by_gradprobe") for d in ddps) and all(
        rr[r]["grad"] is None for n in stalled for rr in [rows[n]] for r in rr if rr[r].get("requires_grad"))
    situation = ("no_sync" if no_sync else "ddp_stalled_by_gradprobe" if ours else "ddp_stalled" if stalled
                 else "not_sharded" if sharded else "not_averaged")
    name = grads[0]
    loc = {"no_sync": first.get("no_sync_at"), "not_sharded": sharded[-1] if sharded else None, "ddp_stalled": None,
           "ddp_stalled_by_gradprobe": None,
           "not_averaged": _first_reduce(rows) or first.get("reduce_at")}[situation] or step
    yield GP704.finding(situation, parameters=grads, location=loc,
                        evidence={"ranks": sorted(obs), "step_location": step, "no_gradient": stalled}, name=name,
                        grads=_values(rows[name], "grad"), count=len(grads), stalled=_names(stalled),
                        stalled_count=len(stalled))


GP705: Rule[RankFacts] = Rule(
    code="GP705", name="gradient-sum-not-averaged", severity="error", rank=23,
    summary="Gradients were all-reduced with SUM by hand and not divided by the world size before the step.",
    why="dist.all_reduce sums by default: a hand-written data-parallel step that all-reduces each gradient and does not "
        "divide by the world size steps with world_size times the average gradient, an effective learning rate that "
        "grows with the number of ranks (DDP averages; a script replacing it must too).",
    example="for p in model.parameters():\n    dist.all_reduce(p.grad)   # a sum over ranks, never divided",
    message="{count} gradient(s) ({names}) were all-reduced with SUM at {line} and not divided by the world size "
            "({world_size}) before optimizer.step(): {name}'s gradient summed to {after:.6g} from {before} on the "
            "ranks, {world_size} times their average.",
    fix="Average instead of summing: `dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)`, or divide after the sum "
        "(`p.grad /= dist.get_world_size()`), at {line}.",
)


@GP705.detector
def detect_sum_not_averaged(facts: RankFacts) -> Iterator[Finding]:
    obs = facts.observations
    n = len(obs)
    if n < 2 or any(o.get("loss_scaled_by_world") for o in obs.values()):  # a sum of losses / world_size: an average
        return
    hits: list[str] = []
    detail: tuple[str, float, str, dict[str, Any] | None] | None = None
    for name, rows in _plain_rows(obs).items():
        reds = [rows[r].get("reduced") for r in rows]
        if not all(red and red.get("op") == "SUM" and red.get("before") is not None for red in reds):
            continue
        total = sum(float(red["before"]) for red in reds if red)
        after = rows[min(rows)]["grad"]
        if after is None or abs(total) < 1e-12 or not _close(after, total) or _close(total, total / n):
            continue
        hits.append(name)
        if detail is None:
            before = ", ".join(f"{float(red['before']):.6g}" for red in reds if red)
            detail = (name, float(after), before, (reds[0] or {}).get("location"))
    if hits and detail is not None:
        name, after, before, loc = detail
        yield GP705.finding(None, parameters=hits, location=loc, evidence={"ranks": sorted(obs)}, count=len(hits),
                            names=_names(hits), line=_line(loc), world_size=n, name=name, after=after, before=before)


GP706: Rule[RankFacts] = Rule(
    code="GP706", name="collective-hangs", severity="error", rank=5,
    summary="A rank waited in a collective that the other ranks never joined, until the script's time ran out.",
    why="Every rank must call the same collectives in the same order: a barrier or all-reduce inside `if rank == 0:`, "
        "a different number of batches per rank, or a DDP gradient bucket one rank never fills (a parameter it did not "
        "use) leaves the others waiting forever (gloo's and NCCL's default timeouts are 30 minutes or more).",
    example="if dist.get_rank() == 0:\n    dist.barrier()   # the other ranks never arrive",
    message="Rank(s) {stuck} were blocked in a collective that the other ranks did not join: {waits}; {others}.",
    fix="Call the same collectives on every rank in the same order: move the collective at {line} out of the rank- or "
        "data-dependent branch (or make every rank take it), and give every rank the same number of steps.",
)


@GP706.detector
def detect_collective_hangs(facts: RankFacts) -> Iterator[Finding]:
    if not facts.stuck:
        return
    waits = []
    for s in facts.stuck:
        what = s.collective or "a call blocked outside Python (no collective in its stack)"
        waits.append(f"rank {s.rank} in {what} at {_line(s.location)}")
    stuck = {s.rank for s in facts.stuck}
    others = [f"rank {r} reached its first optimizer.step() at {_line(loc)}" for r, loc in sorted(facts.reached.items())
              if r not in stuck]
    first = next((s.location for s in facts.stuck if s.location), None)
    yield GP706.finding(None, location=first, evidence={"ranks": sorted(stuck), "stacks": {
                            str(s.rank): s.stack for s in facts.stuck},
                            "collectives": {str(s.rank): s.collective for s in facts.stuck}},
                        stuck=_ranks(sorted(stuck)), waits="; ".join(waits),
                        others="; ".join(others) or "no rank reached a step", line=_line(first))


GP707: Rule[RankFacts] = Rule(
    code="GP707", name="rank-not-checked", severity="info", rank=99,
    summary="A rank's step was not checked: its checks did not finish in the call's time, or the rank ended first.",
    why="Each rank runs the checks on its own captured step, in parallel with the others; on a sharded model (FSDP2) "
        "the checks' replays gather parameters across ranks, so a rank's checks can wait for another's, and a loaded "
        "machine can leave a rank's checks unfinished. The merged report then covers the other ranks only.",
    example="fully_shard(model); ... two ranks on a machine with one free core",
    message="The checks of rank(s) {ranks} did not finish within the call's time after their first step; the findings "
            "come from rank(s) {others} only.",
    fix="Give the call a larger timeout_s (or fewer ranks) to have every rank's step checked.",
    situations={
        "exited": Situation(
            when="a rank's process ended before it reported (its script exited, or it crashed)",
            severity="warning",
            message="Rank(s) {ranks} ended before reporting ({statuses}); the findings come from rank(s) {others} only.",
            fix="Run the script with world_size 1 (or on its own) to see why rank(s) {ranks} ended: an os._exit(), a "
                "signal or a crash in an extension ends a rank without a report."),
    },
)


@GP707.detector
def detect_rank_not_checked(facts: RankFacts) -> Iterator[Finding]:
    everyone = range(facts.world_size)
    for situation, ranks in (("exited", sorted(facts.exited)), (None, sorted(facts.unfinished))):
        if not ranks:
            continue
        others = [r for r in everyone if r not in ranks and r not in facts.exited and r not in facts.unfinished
                  and r not in {s.rank for s in facts.stuck}]
        statuses = ", ".join(f"rank {r}: exit status {facts.exited[r]}" for r in ranks if r in facts.exited)
        evidence: dict[str, Any] = {"ranks": ranks}
        if situation == "exited":
            evidence["exit_status"] = {str(r): facts.exited[r] for r in ranks}
        yield GP707.finding(situation, evidence=evidence, ranks=_ranks(ranks), others=_ranks(others) or "none",
                            statuses=statuses)


RANK_RULES = (GP706, GP703, GP704, GP705, GP707)
