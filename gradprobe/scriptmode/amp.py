"""GP708 on a script's own first step: the autocast its loop entered and its GradScaler, seen as the script ran.

A script's `with torch.autocast(...)` and its `scaler.scale(loss).backward()` are in its loop, not in the step
gradprobe replays (the model's own call): so the script's watch records them while the script runs to its first step
(`AutocastWatch` without a model: each autocast entered, with its line and dtype, and each GradScaler.scale() call;
`StepWatch.amp`: the autocast each top-level module call ran under, and the gradient the script's own backward sent to
that call's outputs). After the checks, the model's call is rerun on copies of the weights, on the same arguments and
seed, under that autocast and with autocast forced off (fp32), backpropagating the very output gradient the script's
loss produced, so the magnitudes that underflow are the script's own (a stand-in loss would not show them). A failure
here is gradprobe's, never the script's: the measure is left out and the report says why.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import call_model
from gradprobe.checks.precision.autocast_underflow import GP708, AutocastWatch, script_underflow
from gradprobe.checks.subcheck_verdicts import drop, subcheck_verdict
from gradprobe.report import make_report
from gradprobe.verdict import summary_body
from gradprobe.scriptmode.observe import ModuleCall
from gradprobe.scriptmode.step import Replay, _call_of, _get, _method_of

if TYPE_CHECKING:
    from gradprobe.scriptmode.run import ScriptRun


def _output_grad_step(rep: Replay, call: ModuleCall) -> Any:
    """The model's call on its recorded arguments, backpropagating the output gradients the script's backward sent."""
    args, kwargs = rep.batch
    grads = dict(call.out_grads)

    def step(model: nn.Module) -> None:
        out = call_model(model, (args, kwargs))
        total = None
        for path, g in grads.items():
            o = _get(out, path)
            term = (o.float() * g.to(o.device)).sum()
            total = term if total is None else total + term
        if total is None or not total.requires_grad:
            raise ValueError("the model's outputs no longer require grad")
        total.backward()

    return step


def _loss_step(rep: Replay) -> Any:
    def step(model: nn.Module) -> None:
        out = call_model(model, rep.batch)
        loss = rep.loss_fn(out, rep.batch) if rep.loss_fn is not None else None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise ValueError("no scalar loss that requires grad")
        loss.reshape(()).backward()

    return step


def amp_report(report: dict[str, Any], watch: AutocastWatch, run: ScriptRun) -> dict[str, Any]:
    """The report with GP708 judged on the script's own step (what the replay's own GP708 saw is replaced: the replay
    runs outside the script's loop, where its autocast and GradScaler are)."""
    rep = run.replayed
    facts = dict(report.get("facts", {}))
    facts.pop("autocast", None)
    drop(facts, "autocast")
    kept = [f for f in report["findings"] if f["code"] != GP708.code]
    call = None if rep is None else _call_of(run.watch, rep.model) if rep.batch is not None else _method_of(run.watch, rep.model)
    if rep is None or call is None or call.autocast is None:
        if len(kept) == len(report["findings"]) and "autocast" not in report.get("facts", {}):
            return report
        return make_report(report["tool"], kept, _summary_tail(report), **facts)
    why_not = None
    if rep.batch is None:  # the user's method (a training_step) is bound to the model itself: not rerun on a copy
        step, why_not = None, "the script's step is a method of the model (its training_step): not rerun on copies"
    elif call.out_grads:
        step = _output_grad_step(rep, call)
    elif rep.loss_fn is not None:
        step = _loss_step(rep)  # no output gradient was kept: the replay's loss (its scale may differ from the script's)
    else:
        step, why_not = None, "the script's loss was not traced to the model's outputs"
    found, afacts = script_underflow(rep.model, step, watch, call.autocast, why_not)
    if step is not None:
        afacts["replayed_with"] = ("the output gradients of the script's own backward" if call.out_grads
                                   else "the replay's loss")
    facts["autocast"] = afacts
    subcheck_verdict(facts, "autocast", afacts)
    checks = list(facts.get("checks", []))
    facts["checks"] = checks + ["autocast"] if "autocast" not in checks else checks
    return make_report(report["tool"], kept + found, _summary_tail(report, facts["checks"]), **facts)


def _summary_tail(report: dict[str, Any], checks: list[str] | None = None) -> list[str]:
    """The summary's lines below its head (make_report writes the head again, from the findings); `checks`: the
    checks that ran, said again."""
    lines = summary_body(report)
    out = [ln for ln in lines if not re.match(r"\d+ more error\(s\): ", ln)]
    if checks:
        out = [f"Checks run: {', '.join(checks)}." if ln.startswith("Checks run: ") else ln for ln in out]
    return out
