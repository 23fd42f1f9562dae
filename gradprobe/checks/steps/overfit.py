"""Overfit one batch (audit_training's opt-in `overfit_steps`): run the user's step K more times on the same fixed
batch and see whether the loss goes down, per loss term where the step returns several (GP616).

The standard first check of a training setup. The loss of each step is what the step returned (a scalar, a dict or
tuple of scalars, an output with `.loss`), else the sum of the losses it called backward() on. The criterion is
robust to noise (dropout, a random loss projection) and to small learning rates: the loss went down when the mean of
the last three losses is at least 10% below the first; it did NOT when it became inf/nan, stayed the same to rounding
(nothing that matters moved), or rose beyond noise (the slope's t statistic over the steps above 3). A loss that falls
by less, or moves within its noise, is reported as such, with no finding. The trainable parameters that did not move
are named.

Per loss term (overfit_terms.py: the entries the step or loss_fn returned, else the sum at the graph's root), each
term's trend is reported, with its line and the trainable tensors its graph reaches. When the total goes down, a term
is a finding only on a measurement that cannot be healthy training: it stayed exactly the same, or it did not go down
while none of the tensors it reaches moved (term_stuck, error, naming those tensors); a term that stayed exactly the
same while all of them moved is info (term_no_gradient: a hinge or a clamp at its floor by design looks the same). A
term that rises while what it reaches moves is in the facts only: a VAE's KL rising while the reconstruction falls is
normal early on, so a rising term is part of a finding only when the total fails too. Term example written from
https://github.com/lucidrains/compressive-transformer-pytorch/issues/5 ("aux_loss does not update any weight").

Written from the public report https://github.com/Ontheway361/antispoof-single-image/issues/12 ("The model loss is
not decreasing even when I try to overfit batches of data") and the practice of overfitting one batch first
(https://github.com/victoresque/pytorch-template/pull/69, "add trainer debugging option overfit_single_batch").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gradprobe.checks.core.step import param_names, run_step
from gradprobe.checks.steps.facts import at, listed
from gradprobe.checks.steps.observe import norms
from gradprobe.checks.steps.overfit_terms import TermInfo, TermRecord, TermWatch, returned_nodes, slope_t
from gradprobe.checks.trace.term_split import Reach
from gradprobe.findings import Finding, Rule, Situation
from gradprobe.wrappers import compiled_wrapper

DEFAULT_STEPS = 20
MAX_STEPS = 200
DROP = 0.9  # the mean of the last three losses must be below first - 10% of |first|
TOTAL = "loss"


@dataclass
class OverfitFacts:
    steps: int  # steps that ran
    terms: dict[str, list[float]]  # per loss term (TOTAL for the loss itself), one value per step
    source: str  # "returned" | "backward" | "none"
    trainable: int
    not_moved: list[str]
    location: dict | None  # the user's step (train_step) or loss, when it is theirs
    error: str | None = None
    results: dict[str, str] = field(default_factory=dict)  # term -> its trend (see `trend`)
    info: dict[str, TermInfo] = field(default_factory=dict)  # term -> its line and the trainable tensors it reaches
    names: dict[int, str] = field(default_factory=dict)  # trainable parameter id -> its name


def trend(values: list[float]) -> str:
    """down (10% below the first loss), slow (down, less), flat (no change beyond rounding), up (rises beyond noise),
    nonfinite, or short (too few steps to tell)."""
    if len(values) < 4:
        return "short"
    if not all(math.isfinite(v) for v in values):
        return "nonfinite"
    first, last = values[0], math.fsum(values[-3:]) / 3
    scale = abs(first) or 1.0
    if last < first - (1 - DROP) * scale:
        return "down"
    if max(values) - min(values) <= 1e-6 * scale:
        return "flat"
    if last > first and slope_t(values) > 3:
        return "up"
    return "slow" if last < first else "noisy"


CRITERION = ("went down: the mean of the last 3 losses at least 10% below the first; did not: inf/nan, unchanged to "
             "rounding, or rising beyond noise (slope t statistic > 3)")
_SAID = {"down": "went down", "slow": "went down, by less than 10%", "noisy": "moved within its noise",
         "flat": "did not change", "up": "went up", "nonfinite": "became inf/nan", "short": "ran too few steps to tell"}

GP616: Rule[OverfitFacts] = Rule(
    code="GP616", name="cannot-overfit-one-batch", severity="error", rank=51,
    summary="The loss does not go down over K steps on one fixed batch (overfit one batch: audit_training's opt-in "
            "overfit_steps): it rises, stays the same, or becomes inf/nan.",
    why="A model that trains at all fits one small batch it sees again and again. A loss that rises steadily, does not "
        "change at all, or diverges there means the update itself is broken (the wrong sign, parameters that never "
        "move, a learning rate of 0, a loss that does not depend on the parameters, gradients lost before the step), "
        "whatever the data and the schedule.",
    example="log_likelihood.backward()   # meant: (-log_likelihood).backward(): every step climbs the loss",
    message="Over {steps} steps on one fixed batch the loss {said}: {first:.4g} at the first step, {last:.4g} at the "
            "last (mean of the last 3){terms}. {moved}",
    fix="Check the sign and the target of what the step at {line} backpropagates: backward() must run on the loss to "
        "minimise (not its negative, and the same loss the step reports), and optimizer.step() must follow it.",
    situations={
        "nothing_moved": Situation(
            when="the loss did not change and no trainable parameter moved over the steps",
            fix="Nothing moved: make sure the step at {line} calls optimizer.step() on an optimizer over the model's "
                "trainable parameters, with a positive learning rate, after backward()."),
        "flat": Situation(
            when="the loss did not change while parameters moved",
            fix="The parameters move but the loss does not depend on them: check that the loss the step at {line} "
                "returns is computed from the model's output of this step (not a detached or cached value)."),
        "nonfinite": Situation(
            when="the loss became inf or nan",
            message="Over {steps} steps on one fixed batch the loss became {last} (first {first:.4g}){terms}. {moved}",
            fix="The loss diverged on one batch: lower the learning rate, or find the op that overflows (a log or "
                "division of 0, fp16 overflow) in the step at {line}."),
        "term_stuck": Situation(
            when="the loss went down but one of its terms did not (it stayed exactly the same, or every trainable "
                 "tensor it reaches stayed put) while trainable tensors it reaches did not move",
            message="Over {steps} steps on one fixed batch the loss {said} ({first:.4g} -> {last:.4g}), but one of its "
                    "terms, {term}, {term_said} ({value:.4g} -> {term_last:.4g}): of the {reached} trainable tensors its graph "
                    "reaches, {stuck_n} did not move: {stuck}.",
            fix="The term at {line} is trained only through tensors that the updates never change: put {stuck} in the optimizer "
                "(a module built after the optimizer, a parameter group left out, a learning rate of 0), or, if they "
                "are meant to stay frozen, drop the term: it trains nothing."),
        "term_no_gradient": Situation(
            when="the loss went down but one of its terms stayed exactly the same while every trainable tensor it "
                 "reaches moved",
            severity="info",
            message="Over {steps} steps on one fixed batch the loss {said} ({first:.4g} -> {last:.4g}), but one of its "
                    "terms, {term}, stayed at {value:.6g} at every step although all {reached} trainable tensors its graph "
                    "reaches moved: it has no gradient on them.",
            fix="If the term at {line} sits at a floor by design (a hinge or margin already met, a clamp such as free "
                "bits), nothing is wrong; otherwise check what it compares: a target computed from the model's own "
                "output (mse(out, out.detach()), a copy of the prediction) always equals it and trains nothing."),
    },
)


@GP616.detector
def detect_cannot_overfit(facts: OverfitFacts) -> Iterator[Finding]:
    total = facts.terms.get(TOTAL)
    verdict = facts.results.get(TOTAL)
    if facts.error or not total:
        return
    if verdict not in ("up", "flat", "nonfinite"):
        yield from _stuck_terms(facts, total)
        return
    others = {k: v for k, v in facts.results.items() if k != TOTAL}
    terms = "; per term: " + ", ".join(f"{k} {_SAID[v]}" for k, v in others.items()) if others else ""
    moved = (f"{len(facts.not_moved)} of {facts.trainable} trainable tensors did not move: {listed(facts.not_moved)}."
             if facts.not_moved else f"All {facts.trainable} trainable tensors moved.")
    finite = verdict != "nonfinite"
    situation = {"nonfinite": "nonfinite", "up": None}.get(verdict, "nothing_moved" if facts.trainable and len(
        facts.not_moved) == facts.trainable else "flat")
    yield GP616.finding(situation, parameters=facts.not_moved, location=facts.location,
                        evidence={"loss_per_step": [round(v, 6) if math.isfinite(v) else str(v) for v in total],
                                  "criterion": CRITERION, "source": facts.source, "trend": facts.results},
                        steps=facts.steps, said=_SAID[verdict], first=total[0],
                        last=math.fsum(total[-3:]) / 3 if finite else str(total[-1]), terms=terms, moved=moved,
                        line=at(facts.location))


def _stuck_terms(facts: OverfitFacts, total: list[float]) -> Iterator[Finding]:
    """The loss went down (or moved within its noise) but one of its terms, whose graph reaches trainable tensors, did
    not: it stayed exactly the same, or it did not go down while none of the tensors it reaches moved. The tensors it
    reaches that did not move are named (term_stuck). A term that stayed exactly the same while all of them moved has no
    gradient on them (term_no_gradient, info: a hinge or a clamp at its floor by design looks the same). A term that
    rises while the tensors it reaches move is trained and reported in the facts only (a VAE's KL rises early on)."""
    not_moved = set(facts.not_moved)
    for key, info in facts.info.items():
        values, said = facts.terms.get(key), facts.results.get(key, "short")
        reached = sorted(facts.names[i] for i in info.reached if i in facts.names)
        stuck = [n for n in reached if n in not_moved]
        if not values or not reached or not (said == "flat" or (stuck == reached and said in ("up", "noisy"))):
            continue
        yield GP616.finding("term_stuck" if stuck else "term_no_gradient", parameters=stuck,
                            location=info.location or facts.location,
                            evidence={"term_per_step": [round(v, 6) for v in values],
                                      "loss_per_step": [round(v, 6) for v in total], "criterion": CRITERION,
                                      "reaches": reached[:50], "trend": facts.results},
                            steps=facts.steps, said=_SAID[facts.results[TOTAL]], first=total[0],
                            last=math.fsum(total[-3:]) / 3, term=key, term_said=_SAID[said], value=values[0],
                            term_last=math.fsum(values[-3:]) / 3, reached=len(reached), stuck=listed(stuck),
                            stuck_n=len(stuck), line=at(info.location or facts.location))


OVERFIT_RULES: tuple[Rule[OverfitFacts], ...] = (GP616,)


def _scalar(v: Any) -> float | None:
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point():
        return float(v.detach().float().item())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def returned_terms(returned: Any) -> dict[str, float]:
    """The loss (and its terms) a step returned: a scalar, a dict or tuple of scalars, or an output with `.loss`."""
    one = _scalar(returned)
    if one is not None:
        return {TOTAL: one}
    if isinstance(returned, dict):
        terms = {str(k): v for k, v in ((k, _scalar(v)) for k, v in returned.items()) if v is not None}
    elif isinstance(returned, (tuple, list)):
        terms = {f"term {i}": v for i, v in enumerate(_scalar(x) for x in returned) if v is not None}
    else:
        loss = _scalar(getattr(returned, "loss", None))
        return {TOTAL: loss} if loss is not None else {}
    if not terms:
        return {}
    if TOTAL not in terms:
        terms = {TOTAL: math.fsum(terms.values()), **terms}
    return terms


class _BackwardLosses:
    """The losses backward() is called on during one step (when the step returns none)."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self._orig: Callable[..., Any] | None = None

    def __enter__(self) -> _BackwardLosses:
        orig = self._orig = torch.Tensor.backward
        seen = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1:
                seen.values.append(float(tensor.detach().float().item()))
            return orig(tensor, *args, **kwargs)

        setattr(torch.Tensor, "backward", backward)  # noqa: B010 (restored on exit)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(torch.Tensor, "backward", self._orig)  # noqa: B010


def _location(loaded: Any) -> dict | None:
    fn = loaded.train_step if loaded.train_step is not None else loaded.loss_fn
    code = getattr(fn, "__code__", None)
    if code is not None and loaded.user.is_user_file(code.co_filename):
        loc: dict | None = loaded.user.location_of(code.co_filename, code.co_firstlineno, code.co_name)
        return loc
    return None


def _weights(model: torch.nn.Module) -> dict[int, float]:
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(zip((id(p) for p in params), norms(params), strict=True)) if params else {}


def overfit_one_batch(loaded: Any, steps: int) -> OverfitFacts:
    """Run the step `steps` times on the target's one batch; the loss per step and per term, and what did not move."""
    steps = max(2, min(int(steps), MAX_STEPS))
    before = _weights(loaded.model)
    reach = Reach(set(before))
    terms: dict[str, list[float]] = {}
    split = TermRecord()
    source, error, ran = "none", None, 0
    # a compiled module runs as it traced: no mode is added around it (its terms are those its step returns)
    compiled = compiled_wrapper(getattr(loaded, "wrapper", None), loaded.model) is not None
    for _ in range(steps):
        watch, parts = _BackwardLosses(), TermWatch(loaded.user)
        result = run_step(loaded, optimizer_step=True, observers=(watch,) if compiled else (watch, parts))
        if result.failed:
            error = (result.error_traceback or result.loss_problem or "the step failed")[-400:]
            break
        ran += 1
        got = returned_terms(result.returned) if loaded.train_step is not None else {}
        if not got and loaded.train_step is None and result.loss is not None:
            got = {TOTAL: float(result.loss.detach().float().item())}
        if got:
            source = "returned"
        elif watch.values:
            got, source = {TOTAL: math.fsum(watch.values)}, "backward"
        for k, v in got.items():
            terms.setdefault(k, []).append(v)
        if got:  # the terms: what the step returned when it returned several, else those of the loss's graph
            named = returned_nodes(result.returned, parts) if len(got) > 1 else {}
            split.add(named or parts.terms, reach)
    after = _weights(loaded.model)
    names = param_names(loaded.model)
    not_moved = sorted(names[pid][0] for pid, w in before.items() if after.get(pid) == w and pid in names)
    if len(terms) == 1 and len(split.values) > 1:
        terms.update((k, v) for k, v in split.values.items() if k != TOTAL)
    kept = {k: v for k, v in terms.items() if len(v) == ran}
    facts = OverfitFacts(steps=ran, terms=kept, source=source, trainable=len(before), not_moved=not_moved,
                         location=_location(loaded), error=error,
                         info={k: i for k, i in split.info.items() if k in kept and k != TOTAL},
                         names={pid: names[pid][0] for pid in before if pid in names})
    facts.results = {k: trend(v) for k, v in facts.terms.items()}
    return facts


def term_trends(facts: OverfitFacts) -> dict[str, dict[str, Any]]:
    """Each term's trend over the steps: first value, mean of the last 3, the slope's t statistic, the verdict; its
    line and the trainable tensors it reaches (and those of them that did not move) where the graph showed them."""
    out: dict[str, dict[str, Any]] = {}
    not_moved = set(facts.not_moved)
    for key, values in facts.terms.items():
        t = slope_t(values)
        row: dict[str, Any] = {"first": _num(values[0]), "last": _num(math.fsum(values[-3:]) / len(values[-3:])),
                               "slope_t": round(t, 2) if math.isfinite(t) else str(t), "trend": facts.results.get(key)}
        info = facts.info.get(key)
        if info is not None:
            reached = sorted(facts.names[i] for i in info.reached if i in facts.names)
            row.update(location=info.location, reaches=len(reached),
                       reached_not_moved=[n for n in reached if n in not_moved][:50])
        out[key] = row
    return out


def _num(v: float) -> float | str:
    return round(v, 6) if math.isfinite(v) else str(v)


def overfit_summary(facts: OverfitFacts) -> tuple[str, dict[str, Any]]:
    """One summary line and the facts table entry."""
    table = {"steps": facts.steps, "source": facts.source, "criterion": CRITERION, "loss_per_step": facts.terms,
             "trend": facts.results, "trainable_tensors": facts.trainable, "not_moved": facts.not_moved[:50],
             "error": facts.error}
    if len(facts.terms) > 1:
        table["terms"] = term_trends(facts)
    total = facts.terms.get(TOTAL)
    if facts.error:
        return f"Overfit one batch: stopped after {facts.steps} step(s), the step raised.", table
    if not total:
        return ("Overfit one batch: the step returned no loss and called backward() on no scalar, so the loss could not "
                "be followed (return the loss from train_step)."), table
    verdict = facts.results.get(TOTAL, "short")
    last = math.fsum(total[-3:]) / len(total[-3:])
    hint = (" (more steps or a larger learning rate would show more)" if verdict in ("slow", "noisy") else "")
    per = "; ".join(f"{k} {_SAID[v]}" for k, v in facts.results.items() if k != TOTAL)
    return (f"Overfit one batch: over {facts.steps} steps on one fixed batch the loss {_SAID[verdict]}, {total[0]:.4g} -> "
            f"{last:.4g}{hint}" + (f" (per term: {per})" if per else "") + "."), table
