"""What one recorded step measured about the gradients: the first stage of the GP3xx engine (checks/trace/engine.py).

`measure` turns the recording (checks/trace/recording.py) into `TraceFacts`: each trainable parameter's
outcome (a gradient, a zero one, a non-finite one, none, never read), the cuts blamed for the
missing ones (checks/trace/attribution.py), what crossed into another process, how the step ended.
The GP3xx rules (checks/trace/cut_rules.py, gradient_rules.py, backward_rules.py) only read these facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from gradprobe.checks.core.step import StepResult, module_of, param_names
from gradprobe.checks.trace.attribution import Cause, blame_cuts, merge_causes, zero_by_initialisation
from gradprobe.checks.trace.dataloader_workers import WorkerCrossing, worker_crossings
from gradprobe.checks.trace.graphwalk import chain
from gradprobe.checks.trace.grad_recorder import GradRecorder
from gradprobe.checks.trace.recording import GradTracer
from gradprobe.checks.trace.term_split import TermSplit, behind_cut_terms, term_table
from gradprobe.checks.core.torchcompat import LOSS_DOES_NOT_REQUIRE_GRAD, LOSS_NOT_DIFFERENTIABLE, LOSS_NOT_SCALAR, tensor_hooks


@dataclass
class Hooked:
    """A trainable parameter with gradient hooks whose gradient ended None or zero."""

    name: str
    hooks: dict[Any, Any]
    grad: str  # "None" or "zero"
    registered_at: Any  # the record's hook site: (what, user line), or None


@dataclass
class TraceFacts:
    """Everything the GP3xx rules read, measured once after the step."""

    tracer: GradTracer
    grads: GradRecorder
    model: nn.Module
    step: StepResult
    record: Any
    names: dict[int, list[str]]
    only: list[str] | None
    table: list[dict[str, Any]]  # per trainable parameter: name, read, grad (ok/zero/none/nonfinite), norm, size
    broken: list[nn.Parameter]  # read by the forward, no gradient
    zero: list[nn.Parameter]  # exactly-zero gradient that initialisation does not explain
    nonfinite: list[nn.Parameter]
    unused: list[nn.Parameter]  # never read by the forward
    by_init: dict[int, str]  # zero gradients a zero-initialised partner explains: id -> partner's name
    loss_tags: frozenset[int]  # candidates whose values reached a loss that backward() ran on
    limited: bool  # a memory limit stopped the step (GP113): its gradients are incomplete, not cut
    stopped_early: bool  # the step failed before gradients could arrive: no cut is blamed
    causes: list[Cause] = field(default_factory=list)
    crossed_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # parameter name -> its first crossing
    workers: list[WorkerCrossing] = field(default_factory=list)
    crossed: set[str] = field(default_factory=set)  # parameter names that crossed a process boundary (any way)
    attributed: set[int] = field(default_factory=set)  # parameters a cut or a crossing explains
    ended: str | None = None  # how the step ended, when not with a usable backward (see _how_it_ended)
    module_norms: dict[str, float] = field(default_factory=dict)  # module -> norm of its parameters' gradients
    hooked: list[Hooked] = field(default_factory=list)
    optimized: frozenset[int] | None = None  # ids of the parameters the step's optimizer holds (None: no optimizer)

    def wanted(self, n: str) -> bool:
        """Whether the caller asked about parameter `n` (every parameter when it named none)."""
        return not self.only or any(n == o or n.startswith(o.rstrip(".") + ".") for o in self.only)

    def name(self, p: nn.Parameter) -> str:
        return self.names[id(p)][0]

    def wanted_names(self, ps: list[nn.Parameter]) -> list[str]:
        return [self.name(p) for p in ps if self.wanted(self.name(p))]

    @property
    def zero_ids(self) -> set[int]:
        return {id(p) for p in self.zero}

    @property
    def backward_broke(self) -> bool:
        """backward() raised for another reason than an unconnected loss."""
        return backward_broke(self.tracer)

    @property
    def gradients_complete(self) -> bool:
        return not self.limited

    def summary(self) -> dict[str, Any]:
        """The facts the report carries (trace_grad_path's and diagnose's `facts`)."""
        tracer = self.tracer
        out = {"per_parameter": self.table, "candidates_seen": len(tracer.candidates), "zero_by_init": self.init_names(),
               "backward_calls": [{k: v for k, v in b.items() if k not in ("tags", "terms")} for b in tracer.backward_calls],
               "crossings": tracer.crossings[:20]}
        # a loss that is a sum: which term reaches which module, and its share of their gradient (checks/trace/term_split.py)
        terms = [{"backward": i, "loss_location": b["terms"].location,
                  "terms": term_table(b["terms"], self.names, tracer.candidates),
                  **({"logged": b["terms"].logged} if b["terms"].logged else {})}
                 for i, b in enumerate(tracer.backward_calls) if isinstance(b.get("terms"), TermSplit)]
        if terms:
            out["loss_terms"] = terms
        if self.step.loss_parts is not None:  # loss_fn returned a dict, tuple or list: the rule that took its total
            out["loss_returned"] = self.step.loss_parts
        return out

    def init_names(self) -> dict[str, str]:
        """Wanted parameters whose zero gradient a zero-initialised partner explains: name -> partner."""
        return {self.names[i][0]: partner for i, partner in self.by_init.items() if self.wanted(self.names[i][0])}


def backward_broke(tracer: GradTracer) -> bool:
    """backward() raised for another reason than an unconnected loss."""
    return tracer.backward_error is not None and LOSS_DOES_NOT_REQUIRE_GRAD not in str(tracer.backward_error)


def _outcomes(tracer: GradTracer, grads: GradRecorder, model: nn.Module,
              names: dict[int, list[str]]) -> tuple[list[dict[str, Any]], dict[str, list[nn.Parameter]]]:
    """The per-parameter table, and the parameters by outcome (broken, zero, nonfinite, unused)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    read = tracer.read | tracer.apply_watch.read
    for p in trainable:
        # parameters swapped in during the step (a data-dependent init replacing nn.Parameter objects on the first
        # call) have names only now, and no gradient hook: their .grad says what they got
        if id(p) not in tracer.names and p.grad is not None:
            read = read | {id(p)}
            if id(p) not in grads.got:
                grads.record(p)
    table: list[dict[str, Any]] = []
    sets: dict[str, list[nn.Parameter]] = {"broken": [], "zero": [], "nonfinite": [], "unused": []}
    for p in trainable:
        g = grads.got.get(id(p))
        status = "none" if g is None else ("nonfinite" if not g["finite"] else ("zero" if g["zero"] else "ok"))
        table.append({"name": names[id(p)][0], "read": id(p) in read, "grad": status,
                      "grad_norm": None if g is None else g["norm"], "numel": p.numel(), "shape": list(p.shape)})
        if g is None:
            sets["broken" if id(p) in read else "unused"].append(p)
        elif status in ("zero", "nonfinite"):
            sets[status].append(p)
    return table, sets


def _how_it_ended(tracer: GradTracer, step: StepResult, error_explained: bool) -> str | None:
    """At most one finding says how the step ended: a memory limit, backward's own error, no usable loss, ..."""
    exc = tracer.backward_error
    if step.resource_limit is not None:  # a memory limit, not the code: no GP308/GP310/GP100 about the step
        return "resource_limit"
    if exc is not None:
        text = str(exc)
        if LOSS_NOT_DIFFERENTIABLE.search(text):
            return "loss_not_connected"
        return "loss_not_scalar" if LOSS_NOT_SCALAR.search(text) else "backward_raised"
    if step.loss_problem:
        return "loss_problem"
    if step.error is not None and not tracer.backward_calls and not error_explained:
        return "step_raised"
    if step.error is not None and tracer.backward_calls and not error_explained:
        return "raised_after_backward"  # the step raised after a backward() that ran (an update, the optimizer step)
    if not tracer.backward_calls and step.kind == "train_step" and step.error is None:
        return "no_backward"
    return None


def _module_norms(facts: TraceFacts) -> dict[str, float]:
    """Per-module gradient norms (GP312 judges a complete backward only)."""
    per_module: dict[str, float] = {}
    for p in (facts.model.parameters() if facts.gradients_complete else ()):
        g = facts.grads.got.get(id(p))
        if g and g["finite"] and g["norm"] > 0:
            m = module_of(facts.names[id(p)][0])
            per_module[m] = math.sqrt(per_module.get(m, 0.0) ** 2 + g["norm"] ** 2)
    return per_module


def _hooked(facts: TraceFacts) -> list[Hooked]:
    """Parameters with gradient hooks whose gradient ended zero or None (GP313 judges a complete backward only)."""
    out: list[Hooked] = []
    for p in (facts.model.parameters() if facts.gradients_complete else ()):
        hooks = tensor_hooks(p)
        if not (hooks and p.requires_grad):
            continue
        g = facts.grads.got.get(id(p))
        if (g is None or g["zero"]) and facts.wanted(n := facts.names[id(p)][0]):
            hook_at = (getattr(facts.record, "hook_sites", None) or {}).get(id(p))
            out.append(Hooked(n, hooks, "None" if g is None else "zero", hook_at))
    return out


def _attribute(facts: TraceFacts) -> None:
    """The cuts blamed for missing and zero gradients, and what crossed into another process."""
    tracer = facts.tracer
    by_cand = blame_cuts(tracer, facts.broken, facts.zero, facts.loss_tags, facts.stopped_early)
    facts.attributed = {id(p) for ps in by_cand.values() for p in ps}
    facts.causes = merge_causes(by_cand, tracer)
    for cause in facts.causes:
        cause.names = facts.wanted_names(cause.params)
        if cause.names:
            cause.chain = chain(cause.candidate, id(cause.params[0]), tracer)
    for c in tracer.crossings:  # parameters sent to other processes as they are (leaf crossings are silent in PyTorch)
        if "parameter" in c:
            facts.crossed_params.setdefault(c["parameter"], c)
    facts.workers = worker_crossings(tracer, facts.names, facts.step, facts.wanted)
    facts.crossed = set(facts.crossed_params) | {n for w in facts.workers for n in w.names}
    facts.attributed |= {id(p) for p in facts.broken if facts.name(p) in facts.crossed}
    # a term of the loss cut from the graph explains the parameters behind its cut (GP315, checks/trace/loss_terms.py)
    splits = [b["terms"] for b in tracer.backward_calls if isinstance(b.get("terms"), TermSplit)]
    if splits:
        facts.attributed |= behind_cut_terms(splits, lambda c: tracer.candidates[c].inputs, tracer.params)


def _optimized(optimizer: Any) -> frozenset[int] | None:
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list):
        return None
    return frozenset(id(p) for g in groups if isinstance(g, dict) for p in g.get("params", []))


def measure(tracer: GradTracer, grads: GradRecorder, model: nn.Module, step: StepResult, only: list[str] | None = None,
            record: Any = None, optimizer: Any = None) -> TraceFacts:
    """The facts of one recorded step."""
    names = {**tracer.names, **param_names(model)}
    table, sets = _outcomes(tracer, grads, model, names)
    by_init = zero_by_initialisation(sets["zero"], grads, model, names, tracer.as_bias)
    calls = tracer.backward_calls
    limited = step.resource_limit is not None
    # a step that raised before any backward() explains every missing gradient by itself: no cut is blamed,
    # but a value measured crossing into another process before the failure stays a crossing; so does a step a
    # memory limit stopped (GP113), wherever it stopped: its gradients are incomplete, not cut.
    # backward() raised on a loss that is part of the graph (not a scalar, say) before any gradient arrived: that
    # failure, not a cut, is why gradients are missing
    stopped_early = limited or (step.error is not None and (not calls or (
        backward_broke(tracer) and any(b.get("requires_grad") for b in calls) and not grads.got)))
    facts = TraceFacts(
        tracer=tracer, grads=grads, model=model, step=step, record=record, names=names, only=only, table=table,
        broken=sets["broken"], zero=[p for p in sets["zero"] if id(p) not in by_init], nonfinite=sets["nonfinite"],
        unused=sets["unused"], by_init=by_init,
        loss_tags=frozenset().union(*(b.get("tags", frozenset()) for b in calls)) if calls else frozenset(),
        limited=limited, stopped_early=stopped_early, optimized=_optimized(optimizer))
    _attribute(facts)
    facts.ended = _how_it_ended(tracer, step, error_explained=bool(facts.workers) and step.error is not None)
    facts.module_norms = _module_norms(facts)
    facts.hooked = _hooked(facts)
    return facts
