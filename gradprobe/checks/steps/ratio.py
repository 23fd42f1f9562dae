"""GP618: one parameter group's update/weight ratio far off, measured over the steps.

The update/weight ratio (the norm of what optimizer.step() changed over the norm of the weights) of a group that
trains sensibly is small, typically 1e-4 to 1e-2 per step. A group whose every step changes it by half its weights or
more (ratio >= 0.5 at each of at least 3 steps) is being overwritten, not trained: its learning rate is orders of
magnitude too large for it (a typo such as lr=1e1 for 1e-1, a per-group lr set in the wrong unit). A group that
started at zero (LoRA's B, zero biases: its first update is its whole weight, ratio 1) does not qualify.

Written from the public report https://github.com/MITDeepLearning/introtodeeplearning/pull/108 (a learning rate
written as 1e-1 where 0.01 was meant) and https://github.com/rasbt/LLMs-from-scratch/issues/692 (a per-group learning
rate set on the wrong group).
"""

from __future__ import annotations

from collections.abc import Iterator

from gradprobe.checks.steps.facts import AuditFacts, GroupStep, at, listed
from gradprobe.findings import Finding, Rule

MIN_STEPS = 3
FAR = 0.5

GP618: Rule[AuditFacts] = Rule(
    code="GP618", name="update-ratio-far-off", severity="warning", rank=52,
    summary="One parameter group's update is half its weights or more at every step (update/weight ratio >= 0.5): its "
            "learning rate is far too large for it.",
    why="A group that trains changes by a small fraction of its weights per step (update/weight around 1e-3). A ratio of "
        "0.5 or more at every step means each step replaces the weights instead of refining them; the loss may still "
        "move, so nothing raises, but that group learns nothing stable.",
    example="SGD([{'params': body.parameters()}, {'params': head.parameters(), 'lr': 1e1}], lr=1e-2)   # meant 1e-1",
    message="Group {group} ({count} tensor(s): {names}) changed by {ratios} of its weights' norm at each of the {steps} "
            "optimizer steps (lr as applied {lr}){others}: every step overwrites it.",
    fix="Lower group {group}'s learning rate where it is set ({line}) by orders of magnitude (a ratio near 1e-3 per step "
        "is typical), or check its unit (a typo such as 1e1 for 1e-1).",
)


def _groups(facts: AuditFacts) -> dict[tuple[int, int], list[GroupStep]]:
    out: dict[tuple[int, int], list[GroupStep]] = {}
    for s in facts.opt_steps:
        for g in s.groups:
            out.setdefault((s.optimizer, g.index), []).append(g)
    return out


@GP618.detector
def detect_ratio_far_off(facts: AuditFacts) -> Iterator[Finding]:
    groups = _groups(facts)
    for (opt, index), seen in groups.items():
        ratios = [g.ratio for g in seen]
        if len(ratios) < MIN_STEPS or any(r is None or r < FAR for r in ratios):
            continue
        if abs((ratios[0] or 0) - 1) < 1e-6:  # started at zero: the first update is the whole weight, exactly
            continue
        names = sorted(facts.name(p) for p in seen[0].params)
        rest = [g.ratio for key, gs in groups.items() if key != (opt, index) for g in gs if g.ratio is not None]
        others = f"; the other groups: {min(rest):.3g}-{max(rest):.3g}" if rest else ""
        site = facts.optimizer_site if opt == facts.initial_optimizer else next(
            (b.location for b in facts.built if b.optimizer == opt), None)
        lrs = sorted({g.lr for g in seen})
        yield GP618.finding(parameters=names, location=site,
                            evidence={"update_ratio": [round(r, 6) for r in ratios if r is not None],
                                      "lr_as_applied": [g.lr for g in seen]},
                            group=index, count=len(names), names=listed(names), steps=len(seen),
                            ratios=", ".join(f"{r:.3g}" for r in ratios if r is not None),
                            lr=", ".join(f"{lr:g}" for lr in lrs), others=others, line=at(site))


RATIO_RULES: tuple[Rule[AuditFacts], ...] = (GP618,)
