"""GP315-GP317: a loss that is a sum of terms, one of which is cut from what the others train.

checks/trace/term_split.py measures, at each backward() on a loss made at a user line, the terms of the sum,
the parameters each reaches and the cuts whose values entered each. A term whose value was cut from
the graph reaches nothing (GP315). A term that depends on a module only through a cut, while other
terms train that module, is GP316 when the cut severs the term from everything behind it and the value
it cut is fed on through modules the term trains (the reconstruction of a VAE whose latent was
detached); it is the design (GP317, info) when another term trains through the very value that was
cut (SimSiam, a GAN's detached fakes beside the generator's term), when the cut value is only a target
or a weight (actor-critic advantages), or when no optimizer holds what lies behind the cut (an EMA
teacher).

Whether the cut value is "fed on" is measured per term (checks/cut_uses.py): a node of the term's graph that took it as
a value and read a parameter. A value that enters the term only as indices (a VQ-VAE's codes, an argmin over the
distances of a detached encoding to the codebook) or only through what a sampling op drew from it (NeRF's fine samples
placed by searchsorted over the coarse weights) is the design (GP317's "index" and "sample" situations): the parameter
that met the cut value in the distance op is not on the term's graph, only the lookup is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gradprobe.checks.core.step import module_of
from gradprobe.checks.trace.candidates import Candidate, Location, family_of
from gradprobe.checks.trace.gradient_facts import TraceFacts
from gradprobe.checks.core.rule_text import at_line, listed
from gradprobe.checks.trace.term_split import Reach, Term, TermSplit, behind, term_table
from gradprobe.findings import Finding, Rule, Situation

GP315: Rule[TraceFacts] = Rule(
    code="GP315", name="loss-term-reaches-nothing", severity="error", rank=51,
    summary="A term of a loss that is a sum was cut from the graph (detach, no_grad, .item(), NumPy) before it was "
            "added: it reaches no parameter.",
    why="A value cut from autograd is a constant to backward(): adding it changes the loss's value, not its gradient, "
        "so everything that term was meant to train learns nothing from it.",
    example="recon = F.mse_loss(decoder(z), x).item()\nloss = kl + recon",
    message="A term of the loss{loss_at} reaches no parameter: the value computed{term_at} is cut from the graph by "
            "`{op}`{cut_at}, so adding it{added_at} changes the loss's value but not its gradient; {behind} get "
            "nothing from it.",
    fix="Keep the term in the graph: remove the cut on its path (add the tensor itself, not its .item() or a detached "
        "copy; log a detached copy separately).",
    situations={
        "untrained": Situation(
            when="what lies behind the cut is held by no optimizer (a teacher or target network): a constant by design",
            severity="info",
            message="A term of the loss{loss_at} reaches no parameter: the value computed{term_at} is cut by `{op}`"
                    "{cut_at}, and what lies behind the cut ({behind}) is held by no optimizer, so this term is a "
                    "constant by design.",
            fix="Nothing to fix if this term is only meant to be reported; to train with it, keep it in the graph."),
    },
)

GP316: Rule[TraceFacts] = Rule(
    code="GP316", name="loss-term-cut-from-module", severity="error", rank=52,
    summary="One term of a loss that is a sum depends on modules only through a cut, while other terms train them: "
            "those modules learn from the other terms only (a false all-clear for gradient flow, since every "
            "parameter still gets a gradient).",
    why="Every parameter gets a gradient from some term, so nothing looks broken; but the cut term's gradient stops at "
        "the cut, and the modules behind it never learn what that term asks of them.",
    example="recon = F.mse_loss(self.decoder(z.detach()), x)\nloss = recon + kl  # the encoder learns from the KL only",
    message="The loss term computed{term_at} does not reach {modules}, which {others} train: `{op}`{cut_at} cuts its "
            "path to them, and the value it cuts is fed on through {through}, which this term does train. So {modules} "
            "learn only from the other term(s); this term's share of their gradient is 0.",
    fix="Remove the cut (`{op}`{cut_at}) so that this term trains {modules} too; keep it only if these modules must "
        "learn from the other terms alone.",
    situations={
        "library": Situation(
            when="library code made the cut",
            severity="warning",
            message="The loss term computed{term_at} does not reach {modules}, which {others} train: `{op}` (made by "
                    "library code{cut_at}) cuts its path to them, and the value it cuts is fed on through {through}, "
                    "which this term trains. So {modules} learn only from the other term(s).",
            fix="Check whether the library is meant to stop this gradient (an option that keeps it, or a call outside "
                "no_grad); if these modules should learn from this term, compute it on a path the library does not cut."),
    },
)

GP317: Rule[TraceFacts] = Rule(
    code="GP317", name="loss-term-stop-gradient", severity="info", rank=53,
    summary="One term of a loss that is a sum reaches modules only through a stop-gradient that the structure shows is "
            "meant: another term trains through the very value that was cut, the cut value is only a target or a "
            "weight, or no optimizer holds what lies behind the cut.",
    why="Stop-gradients by design (SimSiam and BYOL targets, VQ-VAE codebook and commitment terms, a GAN's detached "
        "fakes, actor-critic advantages, EMA teachers) make a term blind to some modules on purpose.",
    example="codebook = F.mse_loss(z_q, z_e.detach())\ncommitment = F.mse_loss(z_e, z_q.detach())\n"
            "loss = recon + codebook + beta * commitment",
    message="The loss term computed{term_at} reaches {modules} only through `{op}`{cut_at}, while {others} train "
            "through the very value that was cut: a stop-gradient by design that splits which term trains what.",
    fix="Nothing to fix if this stop-gradient is meant; remove `{op}` if this term should train {modules}.",
    situations={
        "target": Situation(
            when="the cut value enters the term only as a constant (a target, a weight, an advantage)",
            message="The loss term computed{term_at} uses {modules} only through `{op}`{cut_at}, as a constant (a "
                    "target or a weight), while {others} train them: a stop-gradient by design."),
        "untrained": Situation(
            when="no optimizer holds the parameters behind the cut (an EMA teacher, a target network)",
            message="The loss term computed{term_at} reaches {modules} only through `{op}`{cut_at}, and no optimizer "
                    "holds them: a teacher or target network that this loss is not meant to train."),
        "index": Situation(
            when="the cut value enters the term only as indices or a mask (an argmin over codebook distances): no "
                 "derivative flows there, cut or not",
            message="The loss term computed{term_at} depends on {modules} only through `{op}`{cut_at}, and the value it "
                    "cuts enters this term only as indices (`{use_op}`{use_at}), which carry no gradient with or without "
                    "the cut; {others} train them. The cut changes nothing for this term.",
            fix="Nothing to fix: removing `{op}` would not let this term train {modules}, since `{use_op}` has no "
                "derivative; a straight-through estimator or another term is what trains them."),
        "sample": Situation(
            when="the cut value enters the term only through positions or categories sampled from it (searchsorted, "
                 "multinomial: hierarchical or importance sampling)",
            message="The loss term computed{term_at} depends on {modules} only through `{op}`{cut_at}, and the value it "
                    "cuts enters this term only through what `{use_op}`{use_at} sampled from it (where this term's "
                    "modules are evaluated, not a value they learn from), while {others} train them: a stop-gradient by "
                    "design that keeps the sampler out of this term's gradient.",
            fix="Nothing to fix if the sampler is meant to learn from the other term(s) only (NeRF's coarse network); "
                "remove `{op}` only to differentiate through the sample positions on purpose."),
    },
)

_CUT_FAMILIES = ("detach", "no_grad", "left", "process", "other")


@dataclass
class Severed:
    """What one cut (one user line) hides from one term."""

    term: Term
    split: TermSplit
    cut: Candidate
    missing: frozenset[int]  # ids of the parameters behind the cut that the term does not reach and others do
    names: list[str]  # their names the caller asked about
    situation: str  # "cut", "library", "split", "target", "untrained"


def _splits(facts: TraceFacts) -> Iterator[TermSplit]:
    if facts.limited or facts.stopped_early:
        return
    for b in facts.tracer.backward_calls:
        split = b.get("terms")
        if isinstance(split, TermSplit) and "error" not in b:
            yield split


def _same_or_at(loc: Location | None, near: Location | None) -> str:
    """` on the same line` when `loc` is the line already named, else ` at line N of file`."""
    same = loc and near and (loc.get("file"), loc.get("line")) == (near.get("file"), near.get("line"))
    return " on the same line" if same else _loc(loc)


def _modules(names: list[str]) -> str:
    return listed(sorted({module_of(n) for n in names}), 4)


def _loc(loc: Location | None) -> str:
    return at_line(loc)


def _term_at(term: Term) -> str:
    """` at line N of file`, after the term's key or index when it is an entry a loss_fn returned."""
    if term.name is None:
        return _loc(term.location)
    return (f" for entry `{term.name}`" if isinstance(term.name, str) else f" for entry {term.name}") + _loc(term.location)


@GP315.detector
def term_reaches_nothing(facts: TraceFacts) -> Iterator[Finding]:
    reach = Reach({i for i, p in facts.tracer.params.items() if p.requires_grad})
    for split in _splits(facts):
        for term in split.terms:
            if term.cut is None or not term.cuts:
                continue
            cand = facts.tracer.candidates[max(term.cuts)]
            behind_ids = behind(reach, cand.inputs)
            names = sorted(facts.name(facts.tracer.params[i]) for i in behind_ids)
            untrained = facts.optimized is not None and bool(behind_ids) and not behind_ids & facts.optimized
            yield GP315.finding(
                "untrained" if untrained else None, parameters=[n for n in names if facts.wanted(n)],
                location=cand.where(),
                evidence={"term": term.index, "term_name": term.name, "term_location": term.location,
                          "added_at": term.cut.added_at,
                          "cut": {"op": cand.op, "kind": cand.kind, "location": cand.where()},
                          "parameters_behind_cut": names[:20],
                          "loss_terms": term_table(split, facts.names, facts.tracer.candidates)},
                loss_at=_loc(split.location), term_at=_term_at(term), op=cand.op,
                cut_at=_same_or_at(cand.where(), term.location),
                added_at=_loc(term.cut.added_at), behind=_modules(names) if names else "the parameters behind it")


def severed(facts: TraceFacts) -> Iterator[Severed]:
    """For each live term, each cut (one per family and user line) behind which lie parameters that the term does not
    reach and other terms do, and what the structure says about it."""
    tracer = facts.tracer
    reach = Reach({i for i, p in tracer.params.items() if p.requires_grad})
    for split in _splits(facts):
        for term in split.terms:
            if term.cut is not None or not term.cuts:
                continue
            others = frozenset().union(*(o.reached for o in split.terms if o is not term))
            yield from _outermost(facts, list(_term_cuts(facts, reach, split, term, others)))


def _outermost(facts: TraceFacts, found: list[Severed]) -> Iterator[Severed]:
    """The cuts of one term, less those whose value reaches the term only after a later cut of the list cut it again
    (a straight-through `z + (z_q - z).detach()` whose output the decoder reads detached: the later detach is the
    cause, the straight-through line is correct code)."""
    tags = facts.tracer.tags
    for s in found:
        if not any(o.cut.index > s.cut.index and any(s.cut.index in tags.get(id(x), ()) for x in o.cut.inputs)
                   for o in found):
            yield s


def _term_cuts(facts: TraceFacts, reach: Reach, split: TermSplit, term: Term, others: frozenset[int]) -> Iterator[Severed]:
    tracer = facts.tracer
    seen: set[tuple[str, Any, Any]] = set()
    for ci in sorted(term.cuts):
        cand = tracer.candidates[ci]
        where = cand.where() or {}
        key = (family_of(cand.kind), where.get("file"), where.get("line"))
        if family_of(cand.kind) not in _CUT_FAMILIES or key in seen:
            continue
        cut_off = behind(reach, cand.inputs)
        missing = cut_off & others - term.reached
        if not missing or cut_off & term.reached:  # a path around the cut (a straight-through estimator)
            continue
        seen.add(key)
        names = sorted(n for i in missing if facts.wanted(n := facts.name(tracer.params[i])))
        yield Severed(term, split, cand, missing, names, _judge(facts, term, cand, missing))


def _judge(facts: TraceFacts, term: Term, cand: Candidate, missing: frozenset[int]) -> str:
    if cand.index in term.shared_cuts:
        return "split"
    if facts.optimized is not None and not (missing & facts.optimized):
        return "untrained"
    if term.value_fed is None:  # not measured: the parameters that met the cut's value
        fed = any(cand.index in facts.tracer.param_tags.get(i, frozenset()) for i in term.reached)
    elif cand.index in term.value_fed:
        fed = True
    elif cand.index in term.sample_fed:  # only as indices or samples (checks/cut_uses.py)
        site = facts.tracer.cut_uses.site(cand.index) or {}
        return "sample" if site.get("sampling") else "index"
    else:
        fed = False
    if not fed:
        return "target"
    return "cut" if cand.direct else "library"


def _through(facts: TraceFacts, term: Term, cand: Candidate) -> str:
    fed = [facts.name(facts.tracer.params[i]) for i in term.reached
           if cand.index in facts.tracer.param_tags.get(i, frozenset())]
    return _modules(fed)


def _others(split: TermSplit, term: Term, missing: frozenset[int] | None = None) -> str:
    """The other terms (those that reach the missing parameters when given) by their user lines."""
    others = [o for o in split.terms if o is not term and o.cut is None and (missing is None or o.reached & missing)]
    if split.named:
        return "the other entr" + ("y " if len(others) == 1 else "ies ") + listed(
            [_term_at(o).removeprefix(" for entry ") for o in others], 3) if others else "the other terms"
    lines = [_loc(o.location).removeprefix(" at ") or f"term {o.index}" for o in others]
    return "the term(s) computed at " + listed(lines, 3) if lines else "the other terms"


def _severed_finding(facts: TraceFacts, s: Severed, rule: Rule[TraceFacts], situation: str | None) -> Finding:
    cand = s.cut
    use = facts.tracer.cut_uses.site(cand.index) if situation in ("index", "sample") else None
    evidence: dict[str, Any] = {"term": s.term.index, "term_name": s.term.name, "term_location": s.term.location,
                                "cut": {"op": cand.op, "kind": cand.kind, "location": cand.where()},
                                "loss_terms": term_table(s.split, facts.names, facts.tracer.candidates)}
    if use is not None:
        evidence["cut_value_used_as"] = {"how": situation, "op": use["op"], "location": use["location"]}
    return rule.finding(
        situation, parameters=s.names, location=cand.where(), evidence=evidence,
        use_op=(use or {}).get("op"), use_at=_loc((use or {}).get("location")),
        term_at=_term_at(s.term), modules=_modules(s.names), others=_others(s.split, s.term, s.missing),
        op=cand.op, cut_at=_same_or_at(cand.where(), s.term.location), through=_through(facts, s.term, cand))


@GP316.detector
def term_cut_from_module(facts: TraceFacts) -> Iterator[Finding]:
    for s in severed(facts):
        if s.names and s.situation in ("cut", "library"):
            yield _severed_finding(facts, s, GP316, None if s.situation == "cut" else "library")


@GP317.detector
def stop_gradient_by_design(facts: TraceFacts) -> Iterator[Finding]:
    for s in severed(facts):
        if s.names and s.situation in ("split", "target", "untrained", "index", "sample"):
            yield _severed_finding(facts, s, GP317, None if s.situation == "split" else s.situation)
