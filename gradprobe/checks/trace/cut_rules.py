"""GP301-GP305, GP309: where the path from the loss to a parameter is cut, and what cut it.

Each rule reports the causes of its family (checks/trace/attribution.py: one cause per code and user
line) from the measured `TraceFacts`; GP309 also reports parameters pickled for another process
and DataLoader workers that build samples from tensors that require grad; GP301 also reports the
parameters no located cut explains (a custom backward that returned None, or an unused output).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gradprobe.checks.trace.attribution import Cause
from gradprobe.checks.trace.candidates import Candidate
from gradprobe.checks.trace.gradient_facts import TraceFacts
from gradprobe.checks.core.rule_text import at_line, line_of, listed
from gradprobe.findings import Finding, Rule, Situation

GP301: Rule[TraceFacts] = Rule(
    code="GP301", name="param-gets-no-grad", severity="error", rank=34,
    summary="A trainable parameter that the forward read has .grad None after backward (a warning when nothing cut "
            "the path and its output is simply not used by the loss: an unused pooler, head or branch).",
    why="The path from it to the loss is cut somewhere; the more precise GP30x codes say where when it can be located.",
    example="out = MyFn.apply(x, self.w)  # whose backward returns None for w",
    message="The path from the loss to {count} parameter(s) ({names}) stops requiring grad at `{op}`{at}.{zeroed}",
    fix="Follow evidence.chain to the op that cut the path and keep the computation inside autograd.",
    situations={
        "custom_backward": Situation(
            when="no op cut the path: the parameters were inputs of a custom autograd.Function whose backward returned None",
            message="{count} parameter(s) read by the forward got no gradient: {names}. They were inputs of custom "
                    "autograd.Function(s) {functions} whose backward returned no gradient for them (see run_gradcheck)."),
        "unused_output": Situation(
            when="nothing cut the path: what the parameters compute is not used by the loss",
            severity="warning",
            message="{count} parameter(s) read by the forward got no gradient: {names}. Nothing cut their path: what they "
                    "compute (a pooler, a head, a branch) is not used by this loss. Fine if intended (under "
                    "DistributedDataParallel it needs find_unused_parameters=True); if they should learn, add their output "
                    "to the loss.",
            fix="Use their output in the loss, or drop them (or freeze them) if they are not needed for this objective."),
    },
)

GP302: Rule[TraceFacts] = Rule(
    code="GP302", name="detach-in-forward", severity="error", rank=27,
    summary="The path is cut by .detach(), .data or detach_().",
    why="detach() returns a tensor with no history: everything computed before it gets no gradient from what comes after.",
    example="x_hat = ((x - mean) / std).detach()",
    message="The path from the loss to {count} parameter(s) ({names}) is cut by `{op}`{at}.{zeroed}",
    fix="Remove the .detach() (or .data) on the training path; detach only values that must not be trained through.",
    situations={
        "untrained": Situation(
            when="the parameters behind the detach are in no optimizer: a stop-gradient by design in front of a "
                 "teacher or target network updated outside the optimizer (EMA, copies)",
            severity="info",
            message="The path from the loss to {count} parameter(s) ({names}) is cut by `{op}`{at}, and no optimizer "
                    "holds them: a stop-gradient by design (an EMA teacher, a target network) that this loss is not "
                    "meant to train.{zeroed}",
            fix="Nothing to fix if these parameters are a teacher or target updated outside the optimizer (audit_training "
                "measures that they move); if they should learn from this loss, remove the detach and add them to the "
                "optimizer."),
    },
)

GP303: Rule[TraceFacts] = Rule(
    code="GP303", name="op-under-no-grad", severity="error", rank=28,
    summary="The path is cut because an op ran under no_grad / inference_mode (a warning when library code entered "
            "no_grad itself).",
    why="No graph is recorded under no_grad, so its outputs do not depend on the parameters as far as autograd knows.",
    example="@torch.no_grad()\ndef encode(self, x): ...  # reused by forward",
    message="The path from the loss to {count} parameter(s) ({names}) is cut because `{op}` ran under "
            "no_grad/inference_mode{decorated}{at}.{zeroed}",
    fix="Remove the no_grad decorator/block from the training path, or call an undecorated twin in forward.",
    situations={
        "library": Situation(
            when="library code turned gradients off itself (an index or routing computation)",
            severity="warning",
            message="The path from the loss to {count} parameter(s) ({names}) is cut because `{op}` ran under "
                    "no_grad/inference_mode{decorated}{at}.{zeroed} The library turned gradients off there itself (by "
                    "design, e.g. an index or routing computation), so these parameters are not trained through this path.",
            fix="Nothing to fix if the library means it; train these parameters with the objective the library provides "
                "for them."),
        "untrained": Situation(
            when="the parameters behind the no_grad are in no optimizer: a stop-gradient by design in front of a "
                 "teacher or target network updated outside the optimizer (EMA, copies)",
            severity="info",
            message="The path from the loss to {count} parameter(s) ({names}) is cut because `{op}` ran under "
                    "no_grad/inference_mode{decorated}{at}, and no optimizer holds them: a stop-gradient by design (an EMA "
                    "teacher, a target network) that this loss is not meant to train.{zeroed}",
            fix="Nothing to fix if these parameters are a teacher or target updated outside the optimizer (audit_training "
                "measures that they move); if they should learn from this loss, take this call out of no_grad and add "
                "them to the optimizer."),
    },
)

GP304: Rule[TraceFacts] = Rule(
    code="GP304", name="left-torch", severity="error", rank=26,
    summary="The value left autograd (.item(), .tolist(), .numpy(), float()) and came back as a new tensor.",
    why="NumPy and Python numbers carry no autograd history; torch.tensor/torch.from_numpy makes a fresh leaf.",
    example="h = torch.from_numpy(clip(h.detach().numpy()))",
    message="The path from the loss to {count} parameter(s) ({names}) leaves autograd through `{op}` and comes back as "
            "a new tensor{at}.{zeroed}",
    fix="Do the computation with torch ops (torch.clamp, torch.quantile, ...) so it stays in the graph.",
    situations={
        "left_then_back": Situation(
            when="the line where the value left torch (.item(), .numpy(), float()) and the line where it came back as a "
                 "new tensor are both known and differ: the finding points at the first",
            message="The path from the loss to {count} parameter(s) ({names}) leaves autograd through `.{op}()` at line "
                    "{left_line} of {file} and comes back as a new tensor, with no history, at line {back_line}.{zeroed}",
            fix="Keep the value a tensor at line {left_line}: drop `.{op}()` there and compute with torch ops, so that "
                "what line {back_line} uses is still in the graph (call `.{op}()` only on a copy you log)."),
        "rewrap": Situation(
            when="a tensor that required grad is rebuilt from its data by torch.tensor / as_tensor",
            message="The path from the loss to {count} parameter(s) ({names}) is rebuilt from data by `torch.{op}`, which "
                    "has no history{at}.{zeroed}"),
    },
)

GP305: Rule[TraceFacts] = Rule(
    code="GP305", name="non-differentiable-op", severity="error", rank=29,
    summary="The path goes through an op with no gradient (argmax, round, comparisons, integer casts).",
    why="Discrete ops have zero or no derivative; an integer tensor cannot carry a gradient.",
    example="ids = torch.cat([prompt, input_ids], 1).long()",
    message="The path from the loss to {count} parameter(s) ({names}) goes through `{op}`, which has no gradient{at}.{zeroed}",
    fix="Keep the value continuous (softmax instead of argmax, embeddings instead of ids, a straight-through estimator).",
    situations={
        "zero_derivative": Situation(
            when="an op whose derivative is zero (round, floor, sign) explains an exactly-zero gradient",
            message="The path from the loss to {count} parameter(s) ({names}) goes through `{op}`, whose derivative is "
                    "zero{at}.{zeroed}"),
    },
)

GP309: Rule[TraceFacts] = Rule(
    code="GP309", name="crossed-process-boundary", severity="error", rank=25,
    summary="A tensor on the loss's path, or a parameter, was sent to or received from another process.",
    why="Autograd graphs never cross processes: what comes back is a new tensor with no history, and a parameter's "
        "gradient computed in a worker never reaches the parent.",
    example="parts = pool.map(f, frames.detach().chunk(2))",
    message="The path from the loss to {count} parameter(s) ({names}) crosses a process boundary: the tensor is pickled "
            "for another process and what comes back has no history{at}.{zeroed}",
    fix="Keep the differentiable computation in the training process (vectorise it in torch); use processes only for "
        "data loading.",
    situations={
        "saved_and_loaded": Situation(
            when="a value of the graph is serialised (torch.save / pickle) and loaded back",
            message="The path from the loss to {count} parameter(s) ({names}) is serialised{pickled_at} (torch.save / "
                    "pickle) and loaded back as a new tensor with no history{at}.{zeroed}"),
        "saved": Situation(
            when="a value of the graph is serialised (torch.save / pickle, a queue) and not seen coming back",
            message="The path from the loss to {count} parameter(s) ({names}) is serialised{pickled_at} (torch.save / "
                    "pickle) and what comes back has no history{at}.{zeroed}"),
        "parameter": Situation(
            when="parameters themselves were pickled for another process",
            message="{count} parameter(s) were pickled for another process ({names}): gradients computed there never "
                    "reach the parent's .grad."),
        "dataloader_worker": Situation(
            when="DataLoader worker processes run a Dataset that holds tensors that require grad",
            message="{dataset} uses {count} tensor(s) that require grad ({names}) and runs in {workers} DataLoader worker "
                    "process(es){where}: samples cross a process boundary, so no gradient reaches them.",
            fix="Apply the learnable transform in the training process (in the model's forward, on the batch), and keep "
                "the Dataset to plain data loading."),
        "dataloader_worker_failed": Situation(
            when="as dataloader_worker, and the step failed in a worker batching samples that require grad",
            message="{dataset} uses {count} tensor(s) that require grad ({names}) and runs in {workers} DataLoader worker "
                    "process(es){where}: samples cross a process boundary, so no gradient reaches them (here the worker "
                    "failed to batch samples that require grad).",
            fix="Apply the learnable transform in the training process (in the model's forward, on the batch), and keep "
                "the Dataset to plain data loading."),
    },
)


def _cause_evidence(cause: Cause, facts: TraceFacts, zeroed: list[str]) -> dict[str, Any]:
    cand = cause.candidate
    evidence: dict[str, Any] = {"op": cand.op, "kind": cand.kind, "grad_enabled": cand.grad_enabled,
                                "op_location": cand.location, "fed_the_loss": cand.index in facts.loss_tags,
                                "chain": cause.chain}
    if cand.indexes:
        evidence["used_as_index"] = cand.indexes  # its integer output selected from a tensor (an id lookup)
    if cand.left_at:
        evidence["left_at"] = cand.left_at
    if cand.came_back_at:
        evidence["came_back_at"] = cand.came_back_at
    if cand.process_at:
        evidence["pickled_at"] = cand.process_at
    if zeroed:
        evidence["zero_gradient"] = zeroed
    if cand.index in facts.tracer.library_no_grad:
        evidence["no_grad_entered_by"] = "library code"
    return evidence


def _cause_findings(rule: Rule[TraceFacts], facts: TraceFacts, family: str) -> Iterator[Finding]:
    """One finding of `rule` per cause of its family; the candidate's kind picks the situation."""
    for cause in facts.causes:
        if cause.family != family or not cause.names:
            continue
        cand, where = cause.candidate, cause.where
        zero_ids = facts.zero_ids
        zeroed = [facts.name(p) for p in cause.params if id(p) in zero_ids and cand.kind != "zero_derivative"]
        note = ""
        if zeroed:
            note = (f" {len(zeroed)} of them got an exactly-zero gradient rather than none: what still reaches them "
                    + ("carries the all-zero output of this op." if cand.all_zero else "combines with this op's output."))
        decorated = (f" (the function `{where['function']}` is decorated with no_grad)"
                     if cand.kind == "no_grad" and where and where.get("decorated") else "")
        pickled = cand.process_at or {}
        yield rule.finding(
            _situation(cause, facts), parameters=cause.names, location=where,
            evidence=_cause_evidence(cause, facts, zeroed), count=len(cause.names), names=listed(cause.names, 5),
            op=cand.op, at=at_line(where), zeroed=note, decorated=decorated,
            pickled_at=f" at line {pickled['line']}" if pickled.get("line") else "", **_left_and_back(cand))


def _left_and_back(cand: Candidate) -> dict[str, Any]:
    """The lines where a value left torch and came back (GP304's left_then_back situation), else nothing."""
    left, back = cand.left_at, cand.came_back_at
    if not (left and back):
        return {}
    return {"left_line": left["line"], "back_line": back["line"], "file": left["file"].rsplit("/", 1)[-1]}


def _situation(cause: Cause, facts: TraceFacts) -> str | None:
    cand = cause.candidate
    if cand.kind == "left" and cand.left_at and cand.came_back_at and cand.left_at["line"] != cand.came_back_at["line"]:
        return "left_then_back"
    if cand.kind in ("rewrap", "zero_derivative"):
        return cand.kind
    if cand.kind == "process" and cand.op == "pickle":
        return "saved_and_loaded" if cand.came_back_at else "saved"
    if cand.kind == "no_grad" and cand.index in facts.tracer.library_no_grad:
        return "library"
    if cand.kind in ("no_grad", "detach") and facts.optimized is not None and cause.params \
            and not any(id(p) in facts.optimized for p in cause.params):
        return "untrained"  # a stop-gradient in front of parameters no optimizer trains: an EMA teacher, a target net
    return None


@GP302.detector
def detached(facts: TraceFacts) -> Iterator[Finding]:
    yield from _cause_findings(GP302, facts, "detach")


@GP303.detector
def under_no_grad(facts: TraceFacts) -> Iterator[Finding]:
    yield from _cause_findings(GP303, facts, "no_grad")


@GP304.detector
def left_torch(facts: TraceFacts) -> Iterator[Finding]:
    yield from _cause_findings(GP304, facts, "left")


@GP305.detector
def non_differentiable(facts: TraceFacts) -> Iterator[Finding]:
    yield from _cause_findings(GP305, facts, "nondiff")


@GP309.detector
def crossed_process(facts: TraceFacts) -> Iterator[Finding]:
    yield from _cause_findings(GP309, facts, "process")
    crossed = facts.crossed_params
    pnames = [n for n in crossed if facts.wanted(n)]
    if pnames:
        first = next(iter(crossed.values()))
        yield GP309.finding("parameter", parameters=pnames, location=first.get("location"),
                            evidence={"crossings": list(crossed.values())[:10]}, count=len(pnames),
                            names=listed(pnames, 5, more=False))
    for w in facts.workers:
        yield GP309.finding(
            "dataloader_worker_failed" if w.worker_error else "dataloader_worker", parameters=w.names,
            location=w.where or w.iterated_at,
            evidence={"dataset": w.dataset, "num_workers": w.num_workers, "iterated_at": w.iterated_at,
                      "worker_error": w.worker_error},
            dataset=w.dataset, count=len(w.names), names=listed(w.names, 5, more=False), workers=w.num_workers,
            where=f" ({line_of(w.where)})" if w.where else "")


@GP301.detector
def no_gradient(facts: TraceFacts) -> Iterator[Finding]:
    yield from _cause_findings(GP301, facts, "other")
    rest = [p for p in facts.broken if id(p) not in facts.attributed and facts.wanted(facts.name(p))]
    calls = facts.tracer.backward_calls
    if not rest or facts.backward_broke or not calls or facts.limited:
        return
    custom = {}
    for cls, entry in facts.tracer.apply_watch.calls.items():
        for pos, ns in entry["params_at"].items():
            for n in ns:
                custom[n] = f"{cls.__name__} (input {pos})"
    rnames = [facts.name(p) for p in rest]
    via = {n: custom[n] for n in rnames if n in custom}
    yield GP301.finding(
        "custom_backward" if via else "unused_output", parameters=rnames,
        evidence={"custom_function_inputs": via, "backward_called": bool(calls),
                  "cause": "custom backward returned None" if via else "output not used by the loss"},
        count=len(rest), names=listed(rnames, 6), functions=", ".join(sorted(set(via.values()))))
