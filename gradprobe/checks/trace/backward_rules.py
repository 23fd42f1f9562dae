"""GP308, GP310: how the step ended when it did not end with a usable backward, and `step_end_findings` (at most one).

`TraceFacts.ended` says which case it is: a memory limit (GP113, gradprobe/outcomes.py), backward()
raised (GP308, or GP310 when the loss is not connected or not a scalar), the default step found
no usable loss or train_step never called backward() (GP310), the step raised before backward (GP100).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gradprobe.checks.trace.gradient_facts import TraceFacts
from gradprobe.checks.trace.recording import GradTracer
from gradprobe.checks.core.rule_text import line_of
from gradprobe.checks.trace.torch_errors import torch_error_findings
from gradprobe.checks.core.torchcompat import ANOMALY_FRAME, allocation_failure, explain_backward_error, inplace_detail
from gradprobe.checks.trace.candidates import Location
from gradprobe.findings import Finding, Rule, Situation, run_rules
from gradprobe.outcomes import resource_limit_finding, target_failed_finding
from gradprobe.userframes import UserCode

GP308: Rule[TraceFacts] = Rule(
    code="GP308", name="backward-failed", severity="error", rank=30,
    summary="backward() raised.",
    why="In-place modification of a tensor saved for backward, a second backward through a freed graph, a leaf modified "
        "in place, inference tensors saved for backward, or a custom backward returning the wrong number of gradients.",
    example="h = torch.sigmoid(x); h += 1  # sigmoid saved its output",
    message="backward() raised: {explain}. PyTorch: {first}",
    fix="See the message: use out-of-place ops, retain_graph=True only when needed, clone inference tensors.",
    situations={
        "in_place": Situation(
            when="an in-place op of the user's code modified a tensor an earlier op had saved for backward",
            message="backward() raised: {explain}. The in-place op at {line} (`{code}`) modified a tensor that an earlier "
                    "op had saved for backward{saved}. PyTorch: {first}",
            fix="Use the out-of-place form on that line (x = x + y instead of x += y, relu(x) instead of relu_(x)), or "
                "clone the tensor before modifying it."),
        "custom_backward": Situation(
            when="a custom autograd.Function's backward raised when run on its captured inputs (run_gradcheck)",
            message="{function}.backward raised: {error}",
            fix="Fix the error in the traceback of the custom backward."),
    },
)

GP310: Rule[TraceFacts] = Rule(
    code="GP310", name="loss-not-differentiable", severity="error", rank=35,
    summary="The loss is not a scalar, does not require grad, or has no grad_fn.",
    why="backward() needs a scalar that depends on parameters through recorded ops.",
    example="loss = torch.tensor(loss_value)",
    message="{problem}",
    fix="Compute the loss with torch ops from the model's output; reduce it to a scalar (.mean()).",
    situations={
        "not_connected": Situation(
            when="backward() raised because the loss depends on no parameter through recorded ops",
            message="backward() raised because the loss does not depend on any parameter through recorded ops: {error}",
            fix="See the other findings for where the path is cut; the loss must be computed from the model output with "
                "torch ops."),
        "not_scalar": Situation(
            when="backward() was called on a loss that is not a scalar",
            message="backward() was called on a loss of shape {shape}, not a scalar{computed_at}: reduce it (.mean() or "
                    ".sum(), or the loss function's default reduction).",
            fix="Reduce the loss to a scalar before backward(): loss = loss.mean() (or drop reduction='none')."),
        "no_backward": Situation(
            when="the user's train_step never called backward()",
            message="The user's train_step never called backward(): no gradient can reach any parameter.",
            fix="Call loss.backward() in train_step (before optimizer.step())."),
    },
)


def _loss_call(facts: TraceFacts, which: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A backward() call (first or last) and what it was called on."""
    calls = facts.tracer.backward_calls
    call = calls[which] if calls else {}
    return call, {k: call.get(k) for k in ("shape", "requires_grad", "grad_fn")}


@GP310.detector
def loss_not_differentiable(facts: TraceFacts) -> Iterator[Finding]:
    tracer, step = facts.tracer, facts.step
    text = str(tracer.backward_error)
    if facts.ended == "loss_not_connected":
        call, loss = _loss_call(facts, 0)
        yield GP310.finding("not_connected", location=call.get("location"),
                            evidence={"loss": loss, "cuts_found": len({c.index for c in tracer.candidates})},
                            error=text.splitlines()[0])
    elif facts.ended == "loss_not_scalar":
        call, loss = _loss_call(facts, -1)
        made_at = call.get("made_at")
        yield GP310.finding("not_scalar", location=made_at or call.get("location"),
                            evidence={"loss": loss, "backward_called_at": call.get("location"), "error": text.splitlines()[0]},
                            shape=call.get("shape"), computed_at=f" (computed at {line_of(made_at)})" if made_at else "")
    elif facts.ended == "loss_problem":
        gf = getattr(step.loss, "grad_fn", None)
        made_at = tracer.grad_fn_loc.get(id(gf)) if gf is not None else None  # the user line that computed the loss
        yield GP310.finding(location=made_at, evidence=step.loss_evidence, problem=step.loss_problem)
    elif facts.ended == "no_backward":
        yield GP310.finding("no_backward", evidence={"train_step_returned": repr(step.returned)[:200]})


@GP308.detector
def backward_failed(facts: TraceFacts) -> Iterator[Finding]:
    if facts.ended != "backward_raised":
        return
    tracer, step = facts.tracer, facts.step
    text = str(tracer.backward_error)
    called_at = tracer.backward_calls[0]["location"] if tracer.backward_calls else None
    inplace = _inplace_op_behind(tracer, text)
    saved = step.anomaly_location
    yield GP308.finding(
        "in_place" if inplace else None, location=inplace or saved or called_at,
        evidence={"error": text[:2000], "forward_trace": _user_trace(step.anomaly_trace, tracer.user),
                  "saved_at": saved, "modified_in_place_at": inplace, "backward_called_at": called_at},
        explain=explain_backward_error(text), first=text.splitlines()[0].split(" Hint:")[0],
        line=line_of(inplace) if inplace else "", code=inplace.get("code", "") if inplace else "",
        saved=f" (saved at line {saved['line']})" if saved else "")


def _inplace_op_behind(tracer: GradTracer, text: str) -> Location | None:
    """The user line of the in-place op that bumped the saved tensor to the version torch reports."""
    detail = inplace_detail(text)
    if detail is None:
        return None
    shape, version = detail
    hits = [loc for s, v, loc in tracer.inplace_ops if s == shape and v == version and loc is not None]
    return hits[-1] if hits else None


def _user_trace(text: str | None, user: UserCode) -> list[str] | None:
    """An anomaly-mode forward traceback reduced to the user's frames ("file:line in function: code")."""
    if not text:
        return None
    out = []
    for f, line, fn in ANOMALY_FRAME.findall(text):
        if user.is_user_file(f):
            loc = user.location_of(f, int(line), fn)
            out.append(f"{f}:{line} in {fn}: {loc.get('code', '')}")
    return out


def _resource_limit(facts: TraceFacts) -> Finding:
    """GP113 for a step a memory limit stopped: where it stopped, measured (backward, after it, or before it)."""
    tracer, step = facts.tracer, facts.step
    limit = step.resource_limit or {}
    in_backward = allocation_failure(tracer.backward_error) is not None
    if step.not_run:
        phase = "making the optimizer (train_step was not run)"
    elif in_backward:
        phase = "running backward()"
    elif tracer.backward_calls:
        phase = ("finishing the step after backward() (the optimizer step"
                 + (" or the rest of train_step)" if step.kind == "train_step" else ")"))
    else:
        phase = ("running train_step, before backward()" if step.kind == "train_step"
                 else "running the forward and the loss, before backward()")
    called_at = tracer.backward_calls[0]["location"] if tracer.backward_calls else None
    return resource_limit_finding(
        phase, limit, location=step.error_location or (called_at if in_backward else None),
        evidence={"traceback": step.error_traceback, "backward_called_at": called_at,
                  "backward_calls": len(tracer.backward_calls)})


def _step_raised(facts: TraceFacts) -> Finding:
    """GP100 (its `step` situation): the user's step raised before backward(), so nothing could be traced; or after a
    backward() that ran (its `after_backward` situation)."""
    step = facts.step
    err = step.error
    if facts.ended == "raised_after_backward":
        return target_failed_finding("running the step", f"{type(err).__name__}: {err}", situation="after_backward",
                                     location=step.error_location, evidence={"traceback": step.error_traceback})
    text = f"{step.not_run}: {err}" if step.not_run else f"The step raised before backward(): {type(err).__name__}: {err}"
    return target_failed_finding("running the step", text, situation="step", location=step.error_location,
                                 evidence={"traceback": step.error_traceback})


def step_end_findings(facts: TraceFacts) -> list[Finding]:
    """At most one finding on how the step ended (nothing when it ended with a usable backward)."""
    if facts.ended == "resource_limit":  # a memory limit, not the code: no GP308/GP310/GP100 about the step
        return [_resource_limit(facts)]
    if facts.ended in ("step_raised", "raised_after_backward"):  # torch's own error, measured (GP118) where it applies
        measured = torch_error_findings(facts.tracer, facts.step.error, facts.ended == "raised_after_backward")
        return measured or [_step_raised(facts)]
    if facts.ended == "backward_raised" and (measured := torch_error_findings(facts.tracer, facts.tracer.backward_error,
                                                                              after_backward=False)):
        return measured  # GP119: the graph an earlier backward() freed, measured; else GP308 below
    return run_rules((GP310, GP308), facts)
