"""The checks on the step a script target was stopped at, replayed in place (the first-step path, first_step.py, and
diagnose after the watched steps, audit.py), and what a failure of gradprobe's there becomes: left out, never the
user's error."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from gradprobe.findings import Finding
from gradprobe.outcomes import GP100
from gradprobe.report import make_report
from gradprobe.sandbox.protocol import Phase, Result, ToolError, json_safe
from gradprobe.userframes import raised_in_gradprobe
from gradprobe.verdict import Cause, add_not_run, settle, summary_body

if TYPE_CHECKING:
    from gradprobe.loading import BuildRecord
    from gradprobe.scriptmode.run import ScriptRun


def deliver_and_exit(report: ToolError | dict[str, Any], progress: Callable[[str], None]) -> None:
    """Send the report on the child's result channel and exit, without unwinding the script."""
    chan = getattr(progress, "__self__", None)
    if chan is None or not hasattr(chan, "finish"):
        raise SystemExit(1)  # not in a sandboxed child: nothing better to do
    chan.finish(Result(report=report if isinstance(report, ToolError) else json_safe(report)))  # exits


def check_step(tool: str, target: dict[str, Any], options: dict[str, Any], progress: Callable[[str], None],
                run: ScriptRun, record: BuildRecord,
                steps_audit: dict[str, Any] | str | None = None) -> ToolError | dict[str, Any]:
    """The checks on the captured step, replayed in place. `steps_audit`: for diagnose with steps, the audit of the
    script's own steps watched before this one (or why there is none), merged into diagnose's report."""
    import torch
    import torch.nn as nn

    from gradprobe.checks.several.report import models_line
    from gradprobe.tools import run_tool
    from gradprobe.loading import Loaded
    from gradprobe.scriptmode.run import no_step_report
    from gradprobe.scriptmode.replay import replay
    from gradprobe.scriptmode.step import backward_locations
    from gradprobe.wrappers import compiled_wrapper

    watch = run.watch
    cap = watch.capture
    if cap is None:
        return no_step_report(tool, run, target)
    progress(Phase.REPLAYING)
    rep = run.replayed = replay(watch, watch.user)
    if rep is None:
        return no_step_report(tool, run, target)
    torch.set_grad_enabled(True)
    record.stepped = [o for o in watch.optimizers if id(o) in watch.stepped]  # the script's own loop stepped them
    step_facts: dict[str, Any] = {
        "captured_at": cap.how, "step_location": cap.step_location, "closure": cap.closure,
        "backward_locations": backward_locations(watch.backwards), "learning_rates": cap.lrs,
        "model": type(rep.model).__name__, "script_seconds_to_step": round(run.seconds, 3),
        "optimizer": type(cap.optimizer).__name__ if cap.optimizer is not None else None, **rep.facts,
    }
    device = _device_of(rep.model)
    info: dict[str, Any] = {"device": device, "grad_enabled_after_build": True, "script_step": step_facts}
    if steps_audit is not None:
        info["steps_audit"] = steps_audit
    from gradprobe.tools import BY_NAME

    if rep.batch is None and rep.train_step is None and BY_NAME[tool].needs_step:
        return ToolError(tool_error=f"{tool}: the script's step could not be replayed (the model was never called with "
                                    "grad enabled)")
    wrapper = rep.wrapper
    if compiled_wrapper(wrapper) is not None:
        # the script compiled its model while gradprobe's observers were patched in (they are in its graphs and in
        # the wrapper's forward): the checks compare eager with a fresh compile (aot_eager, the portable backend)
        torch._dynamo.reset()
        wrapper = cast(nn.Module, torch.compile(rep.model, backend="aot_eager"))
        step_facts["compiled_afresh"] = "aot_eager"
    loaded = Loaded(model=rep.model, batch=rep.batch, loss_fn=rep.loss_fn, optimizer=cap.optimizer, make_optimizer=None,
                    train_step=rep.train_step, user=watch.user, record=record, device=device, info=info,
                    wrapper=wrapper)
    progress(Phase.CHECKING)
    try:
        report = run_tool(tool, loaded, options)
    except Exception as exc:  # ours: the script's own step ran
        report = left_out(tool, exc, "gradprobe's replay of the script's step")
    if watch.backwards:
        report = _replay_failures_are_ours(tool, report)
    lr_zero_now = bool(cap.lrs) and all(lr == 0 for lr in cap.lrs)
    if lr_zero_now or watch.lr_zero_step is not None:
        first_lrs, first_loc = watch.lr_zero_step or (cap.lrs, cap.step_location)
        step_facts["first_step_lr_zero"] = {"learning_rates": first_lrs, "location": first_loc}
        findings = _lr_zero_findings(report["findings"], first_lrs, first_loc, judged_on=None if lr_zero_now else cap.lrs)
        report = make_report(tool, findings, summary_body(report), **report.get("facts", {}))
    if run.ended in ("raised", "exited", "timeout") and cap.how == "backward":
        # the script stopped between its backward and its first step: say so beside the findings
        how = (f"raised {type(run.exc).__name__}: {run.exc}" if run.ended == "raised" and run.exc is not None
               else {"exited": "called sys.exit()", "timeout": "ran out of time"}.get(run.ended, run.ended))
        step_facts["script_ended"] = f"after its backward, before any optimizer step, the script {how}"[:1500]
        if run.ended == "raised" and run.exc is not None:
            step_facts["script_traceback"] = watch.user.trimmed_traceback(run.exc)
        cause: Cause = ("timeout" if run.ended == "timeout" else
                        "gradprobe" if run.ended == "raised" and raised_in_gradprobe(run.exc) else "user_code")
        add_not_run(report.setdefault("facts", {}), "the script's own optimizer step (never reached: what its code does "
                    "between backward() and step() was not watched)",
                    f"after its first backward the script {how[:400]}"
                    + (" inside gradprobe's own code (gradprobe's failure, not the script's)" if cause == "gradprobe" else ""),
                    cause, watch.user.innermost_of_traceback(run.exc) if run.exc is not None else None)
        report["summary"] += (f"\nThe script {how[:300]} after its first backward, before any optimizer step: the checks "
                              "ran on that backward's gradients only; the optimizer step was not checked.")
    report.setdefault("facts", {})["script_step"] = step_facts
    line = models_line(step_facts.get("models") or [])
    if line:  # several models, checked as one: which, and the frozen ones beside them
        report["summary"] += "\n" + line
    return settle(report)


# a step that failed, a backward that raised, a loss without grad: the script's own step did none of these
# (GP100 here is the trace's "the step failed"; GP308/GP310 are the trace's own codes)
_REPLAY_FAILURES = (GP100.code, "GP308", "GP310")


def left_out(tool: str, exc: Exception, what: str) -> dict[str, Any]:
    """gradprobe raised on a script's step (call it inside the `except`). The script's own step ran, so this is never the
    user's error (no GP000): what failed is left out and the report says so (a memory limit stays GP113)."""
    from gradprobe.checks.core.torchcompat import allocation_failure
    from gradprobe.sandbox.failures import internal_error_report

    if allocation_failure(exc) is not None:
        return internal_error_report(tool, exc)
    error = f"{type(exc).__name__}: {exc}"[:500]
    return make_report(tool, [], [f"{what} failed ({error[:200]}) and was left out. The script's own step ran; this is "
                                  "a gradprobe limitation, not a finding."],
                       replay_left_out={"what": what, "error": error, "internal_traceback": traceback.format_exc()[-4000:]},
                       not_run=[{"check": what, "why": error, "cause": "gradprobe"}])


def _replay_failures_are_ours(tool: str, report: dict[str, Any]) -> dict[str, Any]:
    """The script's real forward and backward ran without error, so a failure of gradprobe's replay of
    that step is gradprobe's, never the user's error: such findings are left out, and the report says so."""
    findings = report["findings"]
    failed = [f for f in findings if f["code"] in _REPLAY_FAILURES]
    if not failed:
        return report
    kept: list[Finding] = [f for f in findings if f["code"] not in _REPLAY_FAILURES]
    note = (f"gradprobe's replay of the script's step failed where the script's own step did not ({failed[0]['message'][:200]}): "
            "that result was left out (a gradprobe limitation, not a finding).")
    facts = dict(report.get("facts", {}), replay_left_out={"findings": failed})
    add_not_run(facts, "the checks that needed gradprobe's replay of the script's step",
                f"the replay failed where the script's own step did not: {failed[0]['message'][:300]}", "gradprobe")
    return make_report(tool, kept, summary_body(report) + [note], **facts)


def _lr_zero_findings(findings: list[Finding], lrs: list[float], loc: dict[str, Any] | None,
                      judged_on: list[float] | None) -> list[Finding]:
    """A first step at lr 0 (a warm-up from 0) moves nothing by design: info, not GP207/GP205.
    With `judged_on` (the lrs of a later step that was checked), updates were judged there."""
    from gradprobe.checks.optimizer.engine import first_step_lr_zero_finding
    from gradprobe.checks.optimizer.param_groups import GP205
    from gradprobe.checks.optimizer.param_updates import GP207

    out = list(findings)
    if judged_on is None:
        out = [f for f in findings if f["code"] != GP205.code
               and not (f["code"] == GP207.code and "lr=0" in f["evidence"].get("reason", ""))]
    info = first_step_lr_zero_finding(lrs, loc, judged_on)
    out.append(info)
    return out


def _device_of(model: Any) -> str:
    for p in model.parameters():
        return str(p.device)
    return "cpu"
