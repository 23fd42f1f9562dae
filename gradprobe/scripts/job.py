"""A tool call on a script target: run the script to its first step, check that step, report."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from gradprobe.findings import Finding, make_finding


def run_script_job(tool: str, target: dict, options: dict, progress: Callable[[str], None]) -> dict:
    import torch

    from gradprobe.checks import run_tool
    from gradprobe.loading import BuildRecord, BuildRecorder, Loaded, seed_everything
    from gradprobe.report import make_report
    from gradprobe.scripts.observe import StepWatch
    from gradprobe.scripts.run import no_step_report, run_script
    from gradprobe.scripts.step import backward_locations, replay
    from gradprobe.userframes import UserCode

    project_dir = os.path.realpath(target["project_dir"])
    user = UserCode(project_dir)
    record = BuildRecord()
    seed_everything(int(target.get("seed") or 0))
    watch = StepWatch(user)
    t0 = time.monotonic()
    with BuildRecorder(user, record):
        run = run_script(target, watch, progress)
    cap = watch.capture
    if cap is None:
        return no_step_report(tool, run, target)
    progress("replaying the captured step")
    rep = replay(watch, user)
    if rep is None:
        return no_step_report(tool, run, target)
    torch.set_grad_enabled(True)
    step_facts: dict[str, Any] = {
        "captured_at": cap.how, "step_location": cap.step_location, "closure": cap.closure,
        "backward_locations": backward_locations(watch.backwards), "learning_rates": cap.lrs,
        "model": type(rep.model).__name__, "script_seconds_to_step": round(run.seconds, 3),
        "optimizer": type(cap.optimizer).__name__ if cap.optimizer is not None else None, **rep.facts,
    }
    info = {"device": _device_of(rep.model), "grad_enabled_after_build": True, "script_step": step_facts}
    loaded = Loaded(model=rep.model, batch=rep.batch, loss_fn=rep.loss_fn, optimizer=cap.optimizer, make_optimizer=None,
                    train_step=rep.train_step, user=user, record=record, device=info["device"], info=info)
    extra: list[Finding] = []
    if rep.batch is None and rep.train_step is None and tool in ("trace_grad_path", "run_gradcheck", "verify_prompt_tuning"):
        return {"tool_error": f"{tool}: the script's step could not be replayed (the model was never called with grad enabled)"}
    progress("checking")
    report = run_tool(tool, loaded, options)
    lr_zero = bool(cap.lrs) and all(lr == 0 for lr in cap.lrs)
    if lr_zero:
        report["findings"] = _lr_zero_findings(report["findings"], cap.lrs, cap.step_location)
        from gradprobe.report import make_report as _mk

        report = dict(_mk(tool, report["findings"], [report["summary"]], **report.get("facts", {})))
    report["findings"] = list(report["findings"]) + extra
    report.setdefault("facts", {})["script_step"] = step_facts
    report["facts"]["script_total_seconds"] = round(time.monotonic() - t0, 3)
    del make_report
    return report


def _lr_zero_findings(findings: list, lrs: list, loc: dict | None) -> list:
    """A first step at lr 0 (a warm-up from 0) moves nothing by design: info, not GP207."""
    out = []
    for f in findings:
        if f["code"] == "GP207" and "lr=0" in f["evidence"].get("reason", ""):
            continue
        if f["code"] == "GP205":
            continue
        out.append(f)
    out.append(make_finding(
        "GP205", f"The script's first optimizer step ran with learning rate 0 in every param group ({lrs}), "
                 "typically a scheduler warming up from 0: that step moves nothing, which is expected; "
                 "updates were not judged on it.",
        location=loc, evidence={"learning_rates": lrs, "first_step_lr_zero": True}, severity="info",
        fix="Nothing to fix if a warm-up schedule starts at 0; to judge updates, let the script run past the first step."))
    return out


def _device_of(model: Any) -> str:
    for p in model.parameters():
        return str(p.device)
    return "cpu"
