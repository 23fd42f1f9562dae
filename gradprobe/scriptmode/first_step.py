"""A tool call on a script target: run the script to its first step, check that step, report (the child's side)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradprobe.report import make_report
from gradprobe.verdict import add_not_run, settle, summary_body
from gradprobe.sandbox.protocol import ToolError
from gradprobe.scriptmode.checked_step import check_step, deliver_and_exit, left_out

if TYPE_CHECKING:
    from gradprobe.checks.steps.observe import StepObserver
    from gradprobe.scriptmode.run import ScriptRun


@dataclass
class _State:
    run: Any = None  # the ScriptRun, once started
    report: ToolError | dict[str, Any] | None = None  # the checks' report, once the step was checked in place


def run_script_job(tool: str, target: dict[str, Any], options: dict[str, Any],
                   progress: Callable[[str], None]) -> ToolError | dict[str, Any]:
    import torch

    from gradprobe.loading import BuildRecord, BuildRecorder, seed_everything
    from gradprobe.scriptmode.observe import StepWatch
    from gradprobe.scriptmode.amp import amp_report
    from gradprobe.scriptmode.run import run_script
    from gradprobe.userframes import UserCode

    if tool == "audit_training" or (tool == "diagnose" and options.get("steps")):
        # several steps, watched as the script runs them (no replay); diagnose then checks the step after them
        from gradprobe.scriptmode.audit import run_audit_job

        return run_audit_job(target, options, progress, diagnose=tool == "diagnose")
    from gradprobe.checks.precision.autocast_underflow import AutocastWatch
    from gradprobe.checks.steps.observe import StepObserver

    project_dir = os.path.realpath(target["project_dir"])
    user = UserCode(project_dir)
    record = BuildRecord()
    seed_everything(int(target.get("seed") or 0))
    watch = StepWatch(user)
    first = StepObserver(None, user, None)  # the script's own first step as it runs: what wrote its gradients
    first.snapshot = first.probe_grads = False  # no copy of the parameters, the script's tensors untouched
    amp = AutocastWatch(None, user)  # the script's own autocasts and GradScaler.scale() calls up to its step (GP708)
    watch.amp = tool == "diagnose"
    t0 = time.monotonic()
    recorder = BuildRecorder(user, record)
    state = _State()

    def finish(run: ScriptRun) -> ToolError | dict[str, Any]:
        _step_after_closure(first, run)
        first.__exit__(None, None, None)
        amp.__exit__(None, None, None)
        try:
            report = check_step(tool, target, options, progress, run, record)
            if tool == "diagnose" and not isinstance(report, ToolError):
                report = _watched_first_step(report, first, run)
                report = amp_report(report, amp, run)
        except Exception as exc:  # ours; never let it reach the script's own `except`, never blame the script
            report = left_out(tool, exc, "gradprobe's checks of the script's step")
        if not isinstance(report, ToolError):
            report.setdefault("facts", {})["script_total_seconds"] = round(time.monotonic() - t0, 3)
        return report

    def on_stuck() -> None:
        # the script swallows every stop (a bare `except:` around its loop): finish the job from here
        run = state.run
        run.restore()
        recorder.__exit__(None, None, None)
        report = state.report or finish(run)
        if not isinstance(report, ToolError):
            report["facts"]["script_swallowed_stop"] = True
        deliver_and_exit(report, progress)

    def on_capture() -> None:
        # the checks run here, inside the script's step, while its state (a Lightning loop, DataLoader
        # workers, a distributed group) is live; then the script is stopped
        run = state.run
        run.restore()
        recorder.__exit__(None, None, None)
        with torch.enable_grad():
            state.report = finish(run)
        run.rearm()

    watch.on_stuck = on_stuck
    watch.on_capture = on_capture
    with recorder, first, amp:
        run = run_script(target, watch, progress, lambda r: setattr(state, "run", r))
    return state.report if state.report is not None else finish(run)


def _step_after_closure(first: StepObserver, run: ScriptRun) -> None:
    """A step given a closure (Lightning: forward, backward and on_before_optimizer_step run inside
    `optimizer.step(closure)`) was recorded by the step pre-hook when step() was entered, before its backward: record
    it again as it stands after the closure, when the step was captured, so that a gradient the closure's hooks wrote
    (a clip to zero) is seen with its line."""
    cap = run.watch.capture if run is not None else None
    if cap is None or not cap.closure or cap.optimizer is None or not first.opt_steps:
        return
    opt = cap.optimizer
    if first.opt_steps[-1].optimizer != id(opt):
        return
    first.opt_steps.pop()
    entered = [i for i, e in enumerate(first.events) if e.kind == "optimizer_step" and e.optimizer == id(opt)]
    if entered:
        del first.events[entered[-1]]
    first._pre_step(opt, (opt,), {})


def _watched_first_step(report: dict[str, Any], first: Any, run: ScriptRun) -> dict[str, Any]:
    """The one-step GP6xx rules on the script's own first step(s) as they ran: a gradient that backward() produced
    and that was zero (or None) when optimizer.step() ran, with the line that wrote it. A failure here is ours:
    left out, and said so."""
    from gradprobe.checks.core.step import param_names
    from gradprobe.checks.steps.facts import AuditFacts
    from gradprobe.checks.steps.gradients import ONE_STEP_RULES
    from gradprobe.findings import run_rules
    from gradprobe.modelset import ModelSet
    from gradprobe.scriptmode.step import choose_model

    zeroed = [c for s in first.opt_steps for c in s.changes if c.before > 0 and not c.after]
    if not zeroed:
        return report
    try:
        cap = run.watch.capture
        in_opt = {pid for s in first.opt_steps for g in s.groups for pid in g.params}
        replayed = run.replayed.model if run.replayed is not None else None
        # several models: the names the replay gave them (`text_encoder.…`), else the model as chosen for one
        model = replayed if isinstance(replayed, ModelSet) else choose_model(run.watch, in_opt, set(), run.watch.user)[0]
        names = {pid: ns[0] for pid, ns in param_names(model).items()} if model is not None else {}
        facts = AuditFacts(calls=len(first.opt_steps), mode="script", names=names, requires_grad={},
                           opt_steps=first.opt_steps, events=first.events, grad_calls=[], built=[], attached=[],
                           initial_optimizer=id(cap.optimizer) if cap is not None and cap.optimizer is not None else None,
                           optimizer_site=None, scheduled=set(), schedule_sites={}, outside_moves={}, ema=[])
        found = list(run_rules(ONE_STEP_RULES, facts))
    except Exception as exc:  # ours: the script's own step ran
        facts = report.setdefault("facts", {})
        facts["watched_step_left_out"] = f"{type(exc).__name__}: {exc}"[:500]
        add_not_run(facts, "the watch of the script's own first step (GP605)", facts["watched_step_left_out"], "gradprobe")
        return settle(report)
    if not found:
        return report
    return make_report(report["tool"], report["findings"] + found, summary_body(report), **report.get("facts", {}))
