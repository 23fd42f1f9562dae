"""One report from the ranks of a script (ranks.py): each rank's own findings merged, each saying which ranks it
holds on (`evidence.ranks`), and the checks across ranks (gradprobe/checks/ranks/rules.py) on what the ranks measured."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from gradprobe.checks.ranks.rules import GP703, GP706, GP707, RANK_RULES, RankFacts, StuckRank
from gradprobe.findings import Finding, run_rules
from gradprobe.report import make_report
from gradprobe.sandbox.failures import GP112
from gradprobe.verdict import CAUSES, add_not_run, add_verified
from gradprobe.sandbox.protocol import ToolError
from gradprobe.scriptmode.rankwatch import collective_of, last_dump
from gradprobe.userframes import UserCode


@dataclass
class RankOutcome:
    """How the ranks ended: reported, exited without a report (their wait status), or stuck (no step, stack dumped)."""

    out_dir: str
    count: int
    exits: dict[int, int] = field(default_factory=dict)
    stuck: list[int] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)  # stepped, but their checks did not end in time
    seconds: float = 0.0


def load_rank_file(out_dir: str, kind: str, i: int) -> Any:
    """`{kind}{i}.json` that process i wrote in out_dir, or None (not written, or cut off)."""
    try:
        with open(os.path.join(out_dir, f"{kind}{i}.json"), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _label(obs: dict[str, Any] | None, i: int) -> int:
    rank = (obs or {}).get("rank")
    return rank if isinstance(rank, int) else i


def merge_findings(reports: dict[int, dict[str, Any]]) -> list[Finding]:
    """The same finding (code, parameters, line) from several ranks once, with the ranks it holds on."""
    merged: dict[tuple[Any, ...], tuple[Finding, list[int]]] = {}
    for rank in sorted(reports):
        for f in reports[rank].get("findings") or []:
            loc = f.get("location") or {}
            key = (f["code"], tuple(f.get("parameters") or ()), loc.get("file"), loc.get("line"))
            if key not in merged:
                merged[key] = (f, [])
            merged[key][1].append(rank)
    out: list[Finding] = []
    for f, ranks in merged.values():
        one: Finding = {**f, "evidence": {**(f.get("evidence") or {}), "ranks": ranks}}
        out.append(one)
    return out


def fold_consequences(across: list[Finding], per_rank: list[Finding]) -> list[Finding]:
    """A parameter used on some ranks only (an error) or a hang breaks the ranks' collectives: a rank whose backward
    then failed in one (GP112, raised in a backward pass) or that died without a report (GP707) shows the effect,
    not a cause of its own; so do ranks left waiting in DDP's gradient all-reduce (GP706) for the bucket that a rank
    which did not use a parameter (GP703) never filled. Those go into the cause's evidence (`consequences`) rather
    than beside it."""
    cause = next((f for code in (GP703.code, GP706.code) for f in across
                  if f["code"] == code and f["severity"] == "error"), None)
    if cause is None:
        return per_rank + across

    def effect(f: Finding) -> bool:
        ev = f.get("evidence") or {}
        if f["code"] == GP112.code:
            return ev.get("ended") == "raised" and "backward" in str(ev.get("furthest_phase") or "")
        if f["code"] == GP706.code and cause["code"] == GP703.code:
            waits = [str(c) for c in (ev.get("collectives") or {}).values()]
            return bool(waits) and all(c.startswith("backward") for c in waits)
        return f["code"] == GP707.code and "exit_status" in ev

    folded = [f for f in per_rank + across if f is not cause and effect(f)]
    if folded:
        cause["evidence"] = {**(cause.get("evidence") or {}), "consequences": [
            {"code": f["code"], "ranks": (f.get("evidence") or {}).get("ranks"), "message": f["message"]} for f in folded]}
    return [f for f in per_rank + across if not any(f is g for g in folded)]


def _stuck(outcome: RankOutcome, labels: dict[int, int], user: UserCode) -> list[StuckRank]:
    out = []
    for i in outcome.stuck:
        stack = last_dump(os.path.join(outcome.out_dir, f"stack{i}.txt"))
        collective, loc = collective_of(stack, user)
        out.append(StuckRank(rank=labels[i], collective=collective, location=loc, stack=stack[-3000:]))
    return out


def merge_ranks(tool: str, target: dict[str, Any], outcome: RankOutcome, how: str,
                spawn_location: dict[str, Any] | None = None) -> ToolError | dict[str, Any]:
    user = UserCode(os.path.realpath(target["project_dir"]))
    n = outcome.count
    obs = {i: load_rank_file(outcome.out_dir, "obs", i) for i in range(n)}
    labels = {i: _label(obs[i], i) for i in range(n)}
    results = {i: load_rank_file(outcome.out_dir, "result", i) for i in range(n)}
    reports = {labels[i]: r for i, r in results.items() if isinstance(r, dict) and "findings" in r}
    errors = [r for r in results.values() if isinstance(r, dict) and "tool_error" in r]
    if not reports and errors and not outcome.stuck:
        return ToolError(**errors[0])
    facts = RankFacts(world_size=n, observations={labels[i]: o for i, o in obs.items() if isinstance(o, dict)},
                      used={labels[i]: u for i in range(n) if isinstance(u := load_rank_file(outcome.out_dir, "pre", i), dict)},
                      stuck=_stuck(outcome, labels, user),
                      reached={labels[i]: (o or {}).get("step_location") for i, o in obs.items() if o},
                      unfinished=[labels[i] for i in outcome.unfinished],
                      exited={labels[i]: code for i, code in outcome.exits.items() if results[i] is None})
    findings = fold_consequences(run_rules(RANK_RULES, facts), merge_findings(reports))
    first = reports[min(reports)] if reports else {}
    ranks_facts = [{"rank": labels[i], "index": i, "reported": results[i] is not None,
                    "stepped": obs[i] is not None, "exit_code": outcome.exits.get(i),
                    "stuck": i in outcome.stuck, "checks_unfinished": i in outcome.unfinished,
                    "observation_error": (obs[i] or {}).get("error")} for i in range(n)]
    extra = dict(first.get("facts") or {})
    extra["ranks"] = {"how": how, "world_size": n, "spawned_at": spawn_location, "ranks": ranks_facts,
                      "wait_seconds": round(outcome.seconds, 3)}
    lines = [f"{n} ranks ran ({how}); findings say which ranks they hold on (evidence.ranks)."]
    rank_verdicts(extra, reports, n, how, {labels[i]: o for i, o in obs.items()})
    return make_report(tool, findings, lines, **extra)


def rank_verdicts(facts: dict[str, Any], reports: dict[int, dict[str, Any]], n: int, how: str,
                  observed: dict[int, Any] | None = None) -> None:
    """The merged verdict's facts: what the ranks that reported measured (each line once, with the ranks it holds on
    when not all), the comparison across ranks (with the ranks it lost), and every rank's not-run entries (each with
    its ranks)."""
    facts["verified"], facts["not_run"] = [], []
    lines: dict[str, list[int]] = {}
    entries: dict[tuple[str, str, str], tuple[dict[str, Any], list[int]]] = {}
    for rank in sorted(reports):
        rfacts = reports[rank].get("facts") or {}
        for line in rfacts.get("verified") or []:
            lines.setdefault(str(line), []).append(rank)
        for e in rfacts.get("not_run") or []:
            if isinstance(e, dict):
                key = (str(e.get("check")), str(e.get("why")), str(e.get("cause")))
                entries.setdefault(key, (e, []))[1].append(rank)
    seen = {r: o for r, o in (observed or {}).items() if isinstance(o, dict) and not o.get("error")}
    for rank, o in sorted((observed or {}).items()):
        if isinstance(o, dict) and o.get("error"):
            add_not_run(facts, f"the comparison across ranks of rank {rank}'s parameters and gradients (GP704, GP705)",
                        f"gradprobe's snapshot of rank {rank} at its first step failed: {o['error']}", "gradprobe")
    if reports:
        add_verified(facts, f"{len(reports)} of {n} rank(s) checked ({how})" + (
            f"; parameters and gradients of {len(seen)} rank(s) compared across them at their first step"
            if len(seen) > 1 else ""))
    for line, ranks in lines.items():
        add_verified(facts, line if len(ranks) == len(reports) else f"{line} (rank(s) {', '.join(map(str, ranks))})")
    for (check, why, cause), (e, ranks) in entries.items():
        where = "" if len(ranks) == n else f" (rank(s) {', '.join(map(str, ranks))})"
        add_not_run(facts, check + where, why, cause if cause in CAUSES else "gradprobe", e.get("location"))
