"""`diagnose` (this module is `diagnosis` so that the function keeps the name): every check on one load and one observed step; the root cause first.

The step runs once with every observer active (the trace mode, gradient hooks,
the optimizer's step and zero_grad calls, custom Function capture, the HF base
model's inputs). Each check then reads what it needs. Findings are ranked by
how much they explain (a missing registration before the traces it causes), and
a finding whose parameters are all named by a higher-ranked error is folded into
that error's evidence.related, so one root cause reads as one finding.
"""

from __future__ import annotations

import contextlib

import torch

from gradprobe.checks import gradcheck, optimizer, prompt_tuning, registration, trace
from gradprobe.findings import SEVERITY_RANK, Finding, catalogue
from gradprobe.checks._step import param_names
from gradprobe.flowchart import flow_graph, flow_mermaid
from gradprobe.report import make_report

def _rank(f: Finding) -> tuple:
    """Severity, then the rule's root-cause rank (declared with the rule), then the widest finding first."""
    return (SEVERITY_RANK[f["severity"]], catalogue()[f["code"]]["rank"], -len(f["parameters"]))


def _consequence(code: str) -> bool:
    return catalogue()[code]["consequence"]


def fold(findings: list[Finding]) -> list[Finding]:
    """Rank, then fold findings explained by a higher-ranked error into its evidence.related."""
    kept: list[Finding] = []
    for f in sorted(findings, key=_rank):
        params = set(f["parameters"])
        host = None
        if f["severity"] != "info":
            for k in kept:
                if k["severity"] != "error":
                    continue
                if params and params <= set(k["parameters"]):
                    host = k
                    break
            if host is None and not params and _consequence(f["code"]):
                host = next((k for k in kept if k["severity"] == "error" and not _consequence(k["code"])), None)
        if host is not None:
            host["evidence"].setdefault("related", []).append(
                {"code": f["code"], "name": f["name"], "message": f["message"], "location": f["location"]})
        else:
            kept.append(f)
    return kept


def _attribute(model, path: str):
    owner, _, attr = path.rpartition(".")
    try:
        return getattr(model.get_submodule(owner) if owner else model, attr, None)
    except AttributeError:
        return None


def _forward_caches(findings: list[Finding], model, nonleaf_before: dict) -> list[Finding]:
    """A non-leaf tensor attribute that the observed forward replaced is a per-forward cache (a model diagnosed
    mid-training, after a forward already ran): info, not the lost-leaf error GP109 is for."""
    out = []
    for f in findings:
        path = f["evidence"].get("attribute") if f["code"] == "GP109" else None
        if isinstance(path, str) and path in nonleaf_before and _attribute(model, path) is not nonleaf_before[path]:
            f = {**f, "severity": "info", "evidence": {**f["evidence"], "replaced_by_forward": True},
                 "message": f"`{path}` is a non-leaf tensor the forward stores on the module and replaces on every call "
                            "(a cache from the previous forward): not a parameter, and nothing is lost.",
                 "fix": "Nothing to fix; store it detached (or not at all) if it only serves inspection, to free its graph sooner."}
        out.append(f)
    return out


def diagnose_findings(loaded) -> tuple[list[Finding], dict]:
    model = loaded.model
    findings: list[Finding] = registration.check_registration(model, loaded.record, loaded.info, user=loaded.user)
    facts: dict = {"checks": ["registration"]}
    coverage: list[Finding] = []
    if loaded.optimizer_error is not None or loaded.optimizer is not None:
        coverage, ofacts = optimizer.optimizer_findings(loaded, step=False)
        findings += coverage
        facts["optimizer"] = ofacts
        facts["checks"].append("optimizer")
    if loaded.batch is None and loaded.train_step is None:
        facts["note"] = "no inputs and no train_step: the step-based checks were skipped"
        return findings, facts
    nonleaf_before = {f["evidence"]["attribute"]: _attribute(model, f["evidence"]["attribute"])
                      for f in findings if f["code"] == "GP109" and "attribute" in f["evidence"]}
    found = prompt_tuning.find_prompt(model)
    # a mostly frozen model alone is no prompt tuning, PEFT or not: adapters (LoRA, IA3, ...) feed no input positions;
    # the input embedding trained alone in a frozen LM is (new token embeddings as the tuning mechanism)
    prompt_on = found.any and found.how in ("caller", "peft", "named", "embedding")
    base = prompt_tuning.find_base(model) if prompt_on else None
    opt = loaded.optimizer if isinstance(loaded.optimizer, torch.optim.Optimizer) else None
    before = optimizer.snapshot(model) if opt is not None else None
    tracer = trace.GradTracer(model, loaded.user, provenance=prompt_on)
    grads = trace.GradRecorder(model)
    capture = gradcheck.ApplyWatch(loaded.user, {i: n[0] for i, n in param_names(model).items()}, capture=True)
    direct = gradcheck.DirectForwardWatch(loaded.user)
    base_obs = prompt_tuning.BaseObserver(base, loaded.user) if base is not None else None
    with contextlib.ExitStack() as stack:
        step_obs = stack.enter_context(optimizer.StepObserver(model, opt, loaded.user)) if opt is not None else None
        stack.enter_context(capture)
        stack.enter_context(direct)
        if base_obs is not None:
            stack.enter_context(base_obs)
        step = trace.observed_step(loaded, tracer, grads, optimizer_step=opt is not None)
    findings = _forward_caches(findings, model, nonleaf_before)
    tfindings, tfacts = trace.analyze(tracer, grads, model, step, record=loaded.record)
    findings += tfindings
    facts.update(tfacts)
    facts["checks"].append("trace")
    if step_obs is not None and before is not None and step.error is None and tracer.backward_error is None:
        findings += optimizer.analyze_step(model, opt, before, step_obs, coverage,
                                           optimizer._opt_site(loaded.record, opt)[1])
        facts["step_events"] = step_obs.events[:50]
    if capture.calls or direct.hits:
        gfindings, gfacts = gradcheck.gradcheck_findings(loaded, capture, direct)
        findings += gfindings
        facts["gradcheck"] = gfacts
        facts["checks"].append("gradcheck")
    if not prompt_on:
        findings += prompt_tuning.checkpoint_findings(tracer, tfacts)
    if prompt_on:
        pfindings, pfacts = prompt_tuning.prompt_findings(loaded, trace.TraceRun(tfindings, tfacts, tracer, grads, step), base_obs, found)
        findings += pfindings
        facts["prompt_tuning"] = pfacts
        facts["checks"].append("prompt_tuning")
    return findings, facts


def _unregistered_rows(findings: list[Finding]) -> list[dict]:
    rows = []
    for f in findings:
        if f["code"] in ("GP101", "GP102", "GP103", "GP109", "GP107") and f["severity"] == "error":
            rows += [{"name": n, "read": True, "grad": "none"} for n in f["parameters"]]
    return rows


def diagnose_report(loaded) -> dict:
    findings, facts = diagnose_findings(loaded)
    kept = fold(findings)
    table = facts.get("per_parameter", [])
    names_in_table = {r["name"] for r in table}
    rows = table + [r for r in _unregistered_rows(kept) if r["name"] not in names_in_table]
    frozen = [n for n, p in loaded.model.named_parameters() if not p.requires_grad]
    facts["flow"] = flow_graph(rows, kept, frozen)
    facts["mermaid"] = flow_mermaid(facts["flow"])
    summary = [f"Checks run: {', '.join(facts['checks'])}."]
    if facts.get("note"):
        summary.append(facts["note"])
    if table:
        bad = [r["name"] for r in table if r["grad"] != "ok"]
        summary.append(f"{len(table)} trainable parameters traced, {len(table) - len(bad)} got a finite nonzero gradient.")
    return make_report("diagnose", kept, summary, **facts)


def diagnose(model, batch=None, loss_fn=None, optimizer=None, train_step=None, project_dir=None) -> dict:
    """Library entry: every applicable check on live objects."""
    from gradprobe.loading import live_target

    return diagnose_report(live_target(model, batch, loss_fn, optimizer, train_step, project_dir))
