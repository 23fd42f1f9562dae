"""trace_grad_path: which parameters the loss cannot reach, where the path breaks in the user's code, and why.

One real step runs under the recording mode (checks/trace/recording.py: GradTracer; checks/trace/grad_recorder.py: GradRecorder).
The GP3xx engine is three stages: `measure` the facts of the step (checks/trace/gradient_facts.py: each
parameter's outcome, the cuts blamed for missing gradients, crossings, how the step ended), run the
rules over them in a fixed order (checks/trace/cut_rules.py, gradient_rules.py, backward_rules.py), rank.
This module is the public entry: observed_step, trace_findings, trace_report, trace_grad_path, TraceRun.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import StepResult, attempt_step, run_step
from gradprobe.checks.trace.backward_rules import step_end_findings
from gradprobe.checks.trace.carried_state import carried_graph_findings
from gradprobe.checks.trace.cut_rules import GP301, GP302, GP303, GP304, GP305, GP309
from gradprobe.checks.trace.gradient_facts import TraceFacts, backward_broke, measure
from gradprobe.checks.trace.gradient_rules import GP306, GP307, GP311, GP312, GP313, GP314
from gradprobe.checks.trace.loss_terms import GP315, GP316, GP317
from gradprobe.checks.trace.grad_recorder import GradRecorder
from gradprobe.checks.trace.recording import GradTracer
from gradprobe.checks.trace.zeroing_rules import GP318
from gradprobe.checks.core.torchcompat import ANOMALY_FRAME, allocation_failure, is_anomaly_forward_trace
from gradprobe.findings import Finding, run_rules
from gradprobe.flowchart import flow_graph, flow_mermaid
from gradprobe.report import make_report
from gradprobe.verdict import add_verified
from gradprobe.userframes import UserCode

__all__ = ["GradRecorder", "GradTracer", "TraceRun", "analyze", "observed_step", "trace_findings", "trace_grad_path",
           "trace_report"]

# the order the findings come in: the cuts, what crossed into another process, what no cut explains, the
# gradients that arrived, the terms of a loss that is a sum; then how the step ended; then the health of a complete
# backward
BEFORE_THE_END = (GP302, GP303, GP304, GP305, GP309, GP301, GP318, GP306, GP307, GP311, GP315, GP316, GP317)
AFTER_THE_END = (GP312, GP313, GP314)


def rank(findings: list[Finding], facts: TraceFacts) -> list[Finding]:
    """The findings about located cuts first, in the order of their causes (the cut that fed the loss, then the
    earliest), then every other finding in the order the rules gave them."""
    position = {tuple(c.names): i for i, c in enumerate(facts.causes) if c.names}

    def key(f: Finding) -> tuple[int, int]:
        at = position.get(tuple(f["parameters"])) if "chain" in f["evidence"] else None
        return (0, at) if at is not None else (1, 0)

    return sorted(findings, key=key)


def analyze(tracer: GradTracer, grads: GradRecorder, model: nn.Module, step: StepResult, only: list[str] | None = None,
            record: Any = None, optimizer: Any = None) -> tuple[list[Finding], dict[str, Any]]:
    """The GP3xx findings of one recorded step, and the facts the report carries."""
    facts = measure(tracer, grads, model, step, only, record, optimizer)
    findings = run_rules(BEFORE_THE_END, facts) + step_end_findings(facts) + run_rules(AFTER_THE_END, facts)
    out = facts.summary()
    if not step.failed and step.resource_limit is None and step.not_run is None and tracer.backward_error is None:
        table = out["per_parameter"]
        counts = {s: sum(1 for r in table if r["grad"] == s) for s in ("ok", "zero", "none", "nonfinite")}
        add_verified(out, f"one step traced ({len(tracer.backward_calls)} backward call(s)): {counts['ok']} of {len(table)} "
                          f"trainable parameter(s) got a finite non-zero gradient ({counts['zero']} zero, {counts['none']} "
                          f"none, {counts['nonfinite']} non-finite)")
    return rank(findings, facts), out


def _anomaly_rerun(run: Callable[[], None], user: UserCode) -> tuple[dict[str, Any] | None, str | None]:
    """Re-run a failing step under anomaly mode to find the forward line behind a backward error."""
    traces: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.set_detect_anomaly(True, check_nan=True):
            try:
                run()
            except Exception:
                pass
        traces = [str(w.message) for w in caught if is_anomaly_forward_trace(str(w.message))]
    if not traces:
        return None, None
    text = traces[0]
    frames = ANOMALY_FRAME.findall(text)
    user_frames = [f for f in frames if user.is_user_file(f[0])]
    if not user_frames:
        return None, text[-2000:]
    f = user_frames[-1]
    return user.location_of(f[0], int(f[1]), f[2]), text[-2000:]


def observed_step(loaded: Any, tracer: GradTracer, grads: GradRecorder, optimizer_step: bool = False) -> StepResult:
    """The one step runner with the tracer and gradient recorder active; a failing backward or a
    non-finite gradient is re-run under anomaly mode to find the forward line behind it."""
    step = run_step(loaded, optimizer_step=optimizer_step, observers=(grads, tracer))
    if step.resource_limit is None:  # a train_step that caught its backward()'s allocation failure stopped all the same
        step.resource_limit = allocation_failure(tracer.backward_error)
    bad = backward_broke(tracer)
    nonfinite = any(not g["finite"] for g in grads.got.values())
    if (bad or nonfinite) and step.resource_limit is None:  # re-running a step that ran out of memory would again
        loc, trace = _anomaly_rerun(lambda: attempt_step(loaded, step, optimizer_step), loaded.user)
        if bad:
            step.anomaly_location, step.anomaly_trace = loc, trace
        else:
            step.nonfinite_location, step.nonfinite_anomaly = loc, trace
    return step


@dataclass
class TraceRun:
    """One traced step and what the GP3xx rules made of it (prompt_tuning and diagnose read the rest)."""

    findings: list[Finding]
    facts: dict[str, Any]
    tracer: GradTracer
    grads: GradRecorder
    step: StepResult


def trace_findings(loaded: Any, parameters: list[str] | None = None, optimizer_step: bool = False,
                   provenance: bool = False) -> TraceRun:
    tracer = GradTracer(loaded.model, loaded.user, provenance=provenance)
    grads = GradRecorder(loaded.model)
    step = observed_step(loaded, tracer, grads, optimizer_step=optimizer_step)
    findings, facts = analyze(tracer, grads, loaded.model, step, parameters, record=loaded.record,
                              optimizer=loaded.optimizer)
    if step.error is None:  # a graph the model keeps for the next call (GP119 before torch raises it)
        findings += carried_graph_findings(loaded, tracer)
    return TraceRun(findings, facts, tracer, grads, step)


def trace_report(loaded: Any, parameters: list[str] | None = None) -> dict[str, Any]:
    run = trace_findings(loaded, parameters)
    findings, facts = run.findings, run.facts
    table = facts["per_parameter"]
    frozen = [n for n, p in loaded.model.named_parameters() if not p.requires_grad]
    facts["flow"] = flow_graph(table, findings, frozen)
    facts["mermaid"] = flow_mermaid(facts["flow"])
    counts = {s: sum(1 for r in table if r["grad"] == s) for s in ("ok", "zero", "none", "nonfinite")}
    summary = [f"{len(table)} trainable parameters: {counts['ok']} got a gradient, {counts['zero']} zero, "
               f"{counts['none']} none, {counts['nonfinite']} non-finite; {len(frozen)} frozen."]
    return make_report("trace_grad_path", findings, summary, **facts)


def trace_grad_path(model: nn.Module, batch: Any, loss_fn: Any = None, optimizer: Any = None, train_step: Any = None,
                    project_dir: str | None = None, parameters: list[str] | None = None) -> dict[str, Any]:
    """Library entry: trace one step of a live model (see gradprobe.loading.live_target for project_dir)."""
    from gradprobe.loading import live_target

    return trace_report(live_target(model, batch, loss_fn, optimizer, train_step, project_dir), parameters)
