"""audit_training on a script target (the child's side): run the script, watch its own optimizer steps as they
run (watch_steps.ScriptSteps; nothing is replayed), stop it before step N+1, and judge the steps with the same
facts and GP6xx rules as the build_model()/train_step form (gradprobe/checks/steps).

`diagnose` with `steps` on a script is the same one run: the N steps are watched and judged, then diagnose's
checks run on step N+1, where the script is stopped (its state live, as diagnose's first-step checks have it),
and the audit's findings and measurements join diagnose's report (checks/steps/diagnose_steps.py). Diagnose's
own optimizer step runs after the watched ones, so it never changes what was watched; the script is run once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradprobe.report import make_report
from gradprobe.verdict import Cause, add_not_run, settle, summary_body
from gradprobe.sandbox.protocol import ToolError

if TYPE_CHECKING:
    import torch

    from gradprobe.checks.steps.amp import ScalerWatch
    from gradprobe.checks.steps.facts import AuditFacts
    from gradprobe.loading import BuildRecord
    from gradprobe.scriptmode.run import ScriptRun
    from gradprobe.scriptmode.watch_steps import ScriptSteps

DEFAULT_STEPS = 4
MAX_STEPS = 32


@dataclass
class _State:
    run: ScriptRun | None = None
    report: ToolError | dict[str, Any] | None = None


def run_audit_job(target: dict[str, Any], options: dict[str, Any], progress: Callable[[str], None],
                  diagnose: bool = False) -> ToolError | dict[str, Any]:
    from gradprobe.checks.steps.amp import ScalerWatch
    from gradprobe.loading import BuildRecord, BuildRecorder, seed_everything
    from gradprobe.scriptmode.checked_step import deliver_and_exit, left_out
    from gradprobe.scriptmode.observe import StepWatch, StopScript
    from gradprobe.scriptmode.run import run_script
    from gradprobe.scriptmode.watch_steps import ScriptSteps
    from gradprobe.userframes import UserCode

    steps = max(1, min(int(options.get("steps") or DEFAULT_STEPS), MAX_STEPS))
    user = UserCode(os.path.realpath(target["project_dir"]))
    record = BuildRecord()
    seed_everything(int(target.get("seed") or 0))
    watch = StepWatch(user)
    watch.passive = True
    observer = ScriptSteps(watch, steps, record)
    recorder = BuildRecorder(user, record)
    amp = ScalerWatch(user, observer)  # clipping before unscale_ (GP615), the losses a GradScaler scaled (GP617)
    state = _State()
    t0 = time.monotonic()

    def finish(run: ScriptRun) -> ToolError | dict[str, Any]:
        observer.__exit__(None, None, None)
        recorder.__exit__(None, None, None)
        amp.__exit__(None, None, None)
        report: ToolError | dict[str, Any]
        try:
            report = audit_script_report(observer, record, run, steps, target, amp)
        except Exception as exc:  # ours; never let it reach the script's own `except`, never blame the script
            report = left_out("audit_training", exc, "gradprobe's judgement of the watched steps")
        if diagnose:
            report = _diagnose_after(report, target, options, progress, run, record)
        if not isinstance(report, ToolError):
            report.setdefault("facts", {})["script_total_seconds"] = round(time.monotonic() - t0, 3)
        return report

    def stop(opt: torch.optim.Optimizer, loc: dict[str, Any] | None) -> None:
        # the main optimizer is about to take step N+1: judge the N steps now, while the script's state is live
        run = state.run
        assert run is not None
        run.restore()
        watch.take(opt, loc, closure=False, how="optimizer.step", in_script=False)
        state.report = finish(run)
        run.rearm()
        raise StopScript(f"audit_training watched {steps} optimizer steps")

    def on_stuck() -> None:
        run = state.run
        assert run is not None
        run.restore()
        report = state.report or finish(run)
        if not isinstance(report, ToolError):
            report["facts"]["script_swallowed_stop"] = True
        deliver_and_exit(report, progress)

    observer.stop = stop
    watch.on_stuck = on_stuck
    with recorder, observer, amp:
        run = run_script(target, watch, progress, lambda r: setattr(state, "run", r))
    return state.report if state.report is not None else finish(run)


def _diagnose_after(audit: ToolError | dict[str, Any], target: dict[str, Any], options: dict[str, Any],
                    progress: Callable[[str], None], run: ScriptRun, record: BuildRecord) -> ToolError | dict[str, Any]:
    """diagnose's checks on the step the script is stopped at (or, when it ended, its last step), with the audit of
    the watched steps before it given to diagnose's report. A failure of gradprobe's is left out, never the user's."""
    import torch

    from gradprobe.scriptmode.checked_step import check_step, left_out

    if isinstance(audit, ToolError):
        audit_or_note: dict[str, Any] | str = f"the audit of the watched steps failed: {audit.tool_error[:300]}"
    elif "headline" not in (audit.get("facts") or {}) and not audit.get("findings"):
        audit_or_note = (audit.get("summary") or "no optimizer step was watched").splitlines()[-1][:300]
    else:
        audit_or_note = audit
    report: ToolError | dict[str, Any]
    try:
        with torch.enable_grad():
            report = check_step("diagnose", target, options, progress, run, record, steps_audit=audit_or_note)
    except Exception as exc:  # ours; the script's own steps ran
        report = left_out("diagnose", exc, "gradprobe's checks of the script's step")
    if isinstance(report, ToolError):
        return report
    facts = report.get("facts")
    if isinstance(audit_or_note, dict) and isinstance(facts, dict) and "steps" not in facts and "replay_left_out" in facts:
        # diagnose's checks of the step were left out (ours): the watched steps' audit still stands
        from gradprobe.checks.steps.diagnose_steps import merge_audit

        facts.setdefault("checks", [])
        found, lines = merge_audit(audit_or_note, int(options.get("steps") or 0), list(report["findings"]), facts)
        report = make_report("diagnose", found, summary_body(report) + lines, **facts)
    return report


def _ended(run: ScriptRun) -> str:
    if run.ended == "raised" and run.exc is not None:
        return f"raised {type(run.exc).__name__}: {str(run.exc)[:300]}"
    return {"exited": "called sys.exit()", "timeout": "ran out of time", "finished": "ended"}.get(run.ended, run.ended)


def audit_script_report(observer: ScriptSteps, record: BuildRecord, run: ScriptRun, steps: int,
                        target: dict[str, Any], amp: ScalerWatch | None = None) -> dict[str, Any]:
    from gradprobe.checks.several.report import models_line
    from gradprobe.checks.steps.amp import AMP_RULES
    from gradprobe.checks.steps.engine import facts_report
    from gradprobe.findings import run_rules
    from gradprobe.scriptmode.run import no_step_report

    if observer.done == 0:
        cap = run.watch.capture
        if cap is not None and cap.optimizer is None and cap.how == "backward":
            return make_report("audit_training", [], [
                "The script ran backward() with no optimizer in existence: audit_training watches optimizer steps, so "
                "there was nothing to audit (diagnose checks such a step)."], note="no optimizer",
                not_run=[{"check": "the audit of the training steps", "cause": "not_applicable",
                          "why": "the script ran backward() with no optimizer in existence (diagnose checks such a step)"}])
        if observer.scaler_steps and amp is not None:
            return _all_skipped_report(observer, amp, steps, run)
        return no_step_report("audit_training", run, target)
    facts = script_facts(observer, record)
    scaled = run_rules(AMP_RULES, amp.amp_facts(facts.scaler_steps)) if amp is not None else []
    frozen, frozen_rows = observer.frozen.lines(observer.done) if observer.frozen is not None else ([], [])
    report = facts_report(facts, extra=scaled, owners=observer.owners, measured=frozen)
    opt = observer.main_opt
    step_facts: dict[str, Any] = {
        "watched": "the script's own steps, as they ran (nothing replayed)", "optimizer_steps_watched": observer.done,
        "optimizer": type(opt).__name__ if opt is not None else None, **observer.model_note,
        "script_seconds": round(run.seconds, 3),
        "ended": f"stopped before optimizer step {steps + 1}" if observer.done >= steps else run.ended,
    }
    if frozen_rows:
        step_facts["frozen_models"] = frozen_rows
    line = models_line(observer.model_note.get("models") or [])
    if line:
        report["summary"] += "\n" + line
    cost = observer.cost()
    if cost is not None:
        step_facts["cost"] = cost
    if observer.failed:
        step_facts["measurement_left_out"] = observer.failed
        report["summary"] += (f"\nA measurement of gradprobe's failed ({observer.failed[:200]}) and was left out; "
                              "the script's own steps ran.")
        add_not_run(report["facts"], "a measurement of the watched steps", observer.failed, "gradprobe")
    if observer.done < steps:
        how = _ended(run)
        step_facts["script_ended"] = f"after {observer.done} of {steps} optimizer steps, the script {how}"
        report["summary"] += f"\nThe script {how} after {observer.done} of {steps} optimizer steps; those were audited."
        add_not_run(report["facts"], f"optimizer steps {observer.done + 1} to {steps}", step_facts["script_ended"],
                    _ended_cause(run))
    report["facts"]["script_step"] = step_facts
    return settle(report)


def _ended_cause(run: ScriptRun) -> Cause:
    """Whose it is that the script took fewer steps than asked: a script that finished or exited has no more steps (not
    applicable); one that raised or ran out of time stopped the audit."""
    if run.ended == "timeout":
        return "timeout"
    if run.ended == "raised":
        from gradprobe.userframes import raised_in_gradprobe

        return "gradprobe" if raised_in_gradprobe(run.exc) else "user_code"
    return "not_applicable"


def _all_skipped_report(observer: ScriptSteps, amp: ScalerWatch, steps: int, run: ScriptRun) -> dict[str, Any]:
    """Every scaler.step() the script called skipped its optimizer step: no optimizer step to audit but that."""
    from gradprobe.checks.steps.amp import AMP_RULES
    from gradprobe.findings import run_rules

    found = run_rules(AMP_RULES, amp.amp_facts(observer.scaler_steps))
    n = len(observer.scaler_steps)
    ended = f"stopped after {n} skipped steps" if n > steps else run.ended
    return make_report("audit_training", found, [
        f"The script's GradScaler skipped the optimizer step at all {n} of its scaler.step() calls: no optimizer step "
        "ran, so the steps' other measurements have nothing to judge."],
        script_step={"watched": "the script's own steps, as they ran (nothing replayed)", "optimizer_steps_watched": 0,
                     "scaler_steps_skipped": n, "ended": ended},
        scaler_steps=[{"scale": s.scale, "skipped": s.skipped, "location": s.location} for s in observer.scaler_steps])


def script_facts(observer: ScriptSteps, record: BuildRecord) -> AuditFacts:
    """The watched steps as audit_training's facts (the same dataclass the build_model()/train_step form fills)."""
    from gradprobe.checks.steps.engine import _pair_ema, _schedule_site, _schedulers_of
    from gradprobe.checks.steps.outside_copies import held_copies
    from gradprobe.checks.steps.schedule import pace
    from gradprobe.checks.steps.facts import AuditFacts, derive

    observer.measure_outside()  # the interval after the last step, when the script ended there
    observer.model_params()  # names of parameters attached since the last step
    for call in observer.grad_calls:
        call.used_in_backward = any(getattr(t, "grad", None) is not None for t in call.probes)
        call.probes = []
    opt = observer.main_opt
    site = record.optimizer_sites.get(id(opt)) if opt is not None else None
    scheduled = {e.optimizer for e in observer.events if e.kind == "scheduler_step" and e.optimizer is not None}
    sites = {id(s.optimizer): _schedule_site(s, observer.user) for s in observer.schedulers.values()}
    in_opt = {pid for s in observer.opt_steps for g in s.groups for pid in g.params}
    ema = observer.ema if observer.ema is not None else \
        _pair_ema(observer.model, in_opt, observer.names, record) if observer.model is not None else []
    for copy in ema:
        copy.moved = [any(k < len(observer.outside.get(pid, ())) and observer.outside[pid][k] for pid in copy.params)
                      for k in range(observer.intervals)]
    if observer.ema is not None:
        observer.measured_copies(ema)
    held, held_names = held_copies(observer.held, observer.held_intervals, observer.names)
    ema = [*ema, *held]
    facts = AuditFacts(calls=observer.done, mode="script", names=observer.names, requires_grad=observer.requires_grad,
                       opt_steps=observer.opt_steps, events=observer.events, grad_calls=observer.grad_calls,
                       built=observer.built, attached=observer.attached, initial_optimizer=id(opt) if opt else None,
                       optimizer_site=site[1] if site else None, scheduled=scheduled,
                       schedule_sites={k: v for k, v in sites.items() if v}, outside_moves=observer.outside, ema=ema,
                       scaler_steps=observer.scaler_steps, mode_calls=observer.mode_calls)
    scheds = _schedulers_of(opt) if opt is not None else []
    if len(scheds) == 1:  # one scheduler on the main optimizer (a SequentialLR and its parts are left alone)
        found = pace(scheds[0], observer.events, id(opt), observer.done, observer.loader,
                     observer.scheduler_sites.get(id(scheds[0])))
        facts.schedules = [found] if found is not None else []
    derive(facts)
    facts.names.update(held_names)  # after derive: a copy held outside the model gets no per-parameter verdict
    return facts
