"""`diagnose` (this module is `diagnosis` so that the function keeps the name): every check on one load and one
observed step; the root cause first.

The step runs once with every observer active (the trace mode, gradient hooks,
the optimizer's step and zero_grad calls, custom Function capture, the HF base
model's inputs). Each check then reads what it needs. Findings are ranked by
how much they explain (a missing registration before the traces it causes), and
a finding that shares its cause with a higher-ranked error (the same line, or a
causal link declared in EXPLAINS) and whose parameters that error all names is
folded into its evidence.related, so one root cause reads as one finding and an
unrelated error never hides a real one. After the step, what the step itself set
on modules is inspected again (lazy state, parameters replaced on the first call).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.compiled import engine as compiled
from gradprobe.checks.core.step import StepResult, param_names
from gradprobe.checks.gradcheck import engine as gradcheck
from gradprobe.checks.optimizer import engine as optimizer
from gradprobe.checks.optimizer.param_updates import GP207, NOT_STEPPED, scaler_skipped
from gradprobe.checks.precision import autocast_underflow
from gradprobe.checks.precision import low_precision as precision
from gradprobe.checks.prompt import engine as prompt_tuning
from gradprobe.checks.registration import engine as registration
from gradprobe.checks.registration import shared_storage as storage
from gradprobe.checks.registration import frozen_init
from gradprobe.checks.registration.trainable_set import compact, trainable_set
from gradprobe.checks.steps.facts import at
from gradprobe.checks.trace import engine as trace
from gradprobe.checks.trace.carried_state import carried_graph_findings
from gradprobe.checks.trace.grad_recorder import GradRecorder
from gradprobe.checks.trace.gradient_rules import GP307, scaler_overflow
from gradprobe.checks.trace.recording import GradTracer
from gradprobe.findings import SEVERITY_RANK, Finding, catalogue, run_rules
from gradprobe.flowchart import flow_graph, flow_mermaid
from gradprobe.loading import BuildRecorder
from gradprobe.report import make_report
from gradprobe.checks.subcheck_verdicts import subcheck_verdict
from gradprobe.verdict import add_not_run, add_verified, lift

# what does not run when the step cannot (no inputs, or the optimizer a train_step needs failed to build)
STEP_CHECKS = "the step checks (trace, optimizer step, gradcheck, prompt tuning, compile, precision)"

def _rank(f: Finding) -> tuple[int, int, int]:
    """Severity, then the rule's root-cause rank (declared with the rule), then the widest finding first."""
    return (SEVERITY_RANK[f["severity"]], catalogue()[f["code"]]["rank"], -len(f["parameters"]))


# causal links: a finding of the key's code makes findings of these codes happen (about the same parameters,
# or about none); only such a link, or the same op/line, lets one finding fold into another
_CUTS = frozenset({"GP301", "GP310", "GP501"})  # "no gradient arrived": what every cut explains
EXPLAINS: dict[str, frozenset[str]] = {
    "GP101": _CUTS, "GP102": _CUTS, "GP103": _CUTS, "GP109": _CUTS | {"GP206", "GP308", "GP510"}, "GP107": _CUTS | {"GP110"},
    "GP110": _CUTS | {"GP308", "GP311"}, "GP111": _CUTS | {"GP303", "GP308"},
    "GP201": frozenset({"GP207", "GP504", "GP606"}), "GP202": frozenset({"GP201", "GP207", "GP504", "GP311", "GP606"}),
    "GP213": frozenset({"GP201", "GP207", "GP606"}),  # an optimizer never stepped: its parameters never move
    "GP204": frozenset({"GP207"}), "GP206": frozenset({"GP207"}), "GP207": frozenset({"GP205"}),
    "GP208": frozenset({"GP201", "GP207", "GP504"}),
    "GP302": _CUTS, "GP303": _CUTS, "GP304": _CUTS, "GP305": _CUTS, "GP309": _CUTS, "GP307": frozenset({"GP207"}),
    "GP401": frozenset({"GP307"}), "GP402": _CUTS | {"GP308"}, "GP403": _CUTS | {"GP308"},
    "GP404": _CUTS | {"GP308"}, "GP406": _CUTS, "GP407": _CUTS,
    "GP502": _CUTS | {"GP305"}, "GP505": _CUTS | {"GP303", "GP305", "GP308"}, "GP510": _CUTS | {"GP504", "GP109"},
    "GP511": _CUTS | {"GP303", "GP308"}, "GP508": frozenset({"GP503"}),
    "GP702": frozenset({"GP207", "GP306"}),  # fp16 weights: underflowed gradients are zero, tiny updates are lost
    "GP708": frozenset({"GP207", "GP306"}),  # fp16 autocast, no GradScaler: underflowed gradients are zero
    "GP903": frozenset({"GP803"}),  # packed examples that see each other: the packed loss and gradients differ
}


def _same_site(a: Finding, b: Finding) -> bool:
    la: dict[str, Any] = dict(a.get("location") or {})
    lb: dict[str, Any] = dict(b.get("location") or {})
    return bool(la.get("file") and la.get("line")) and (la.get("file"), la.get("line")) == (lb.get("file"), lb.get("line"))


def shares_cause(f: Finding, host: Finding) -> bool:
    """f is explained by host: the same op or line, or a causal link from host's code to f's."""
    return _same_site(f, host) or f["code"] in EXPLAINS.get(host["code"], frozenset())


def fold(findings: list[Finding]) -> list[Finding]:
    """Rank, then fold each finding that shares its cause with a higher-ranked error into that error's
    evidence.related. A finding with parameters folds only into an error that names all of them, so every
    parameter without a gradient stays named by an unfolded error."""
    kept: list[Finding] = []
    for f in sorted(findings, key=_rank):
        params = set(f["parameters"])
        host = None
        if f["severity"] != "info":
            host = next((k for k in kept if k["severity"] == "error" and (not params or params <= set(k["parameters"]))
                         and shares_cause(f, k)), None)
        if host is not None:
            host["evidence"].setdefault("related", []).append(
                {"code": f["code"], "name": f["name"], "message": f["message"], "location": f["location"]})
        else:
            kept.append(f)
    return kept


def _attribute(model: nn.Module, path: str) -> Any:
    owner, _, attr = path.rpartition(".")
    try:
        return getattr(model.get_submodule(owner) if owner else model, attr, None)
    except AttributeError:
        return None


def _forward_caches(findings: list[Finding], model: nn.Module, nonleaf_before: dict[str, Any]) -> list[Finding]:
    """A non-leaf tensor attribute that the observed forward replaced is a per-forward cache (a model diagnosed
    mid-training, after a forward already ran): info, not the lost-leaf error GP109 is for."""
    out = []
    for f in findings:
        path = f["evidence"].get("attribute") if f["code"] == "GP109" else None
        if isinstance(path, str) and path in nonleaf_before and _attribute(model, path) is not nonleaf_before[path]:
            f = {**f, "severity": "info", "evidence": {**f["evidence"], "replaced_by_forward": True},
                 "message": f"`{path}` is a non-leaf tensor the forward stores on the module and replaces on every call "
                            "(a cache from the previous forward): not a parameter, and nothing is lost.",
                 "fix": "Nothing to fix; store it detached (or not at all) if it only serves inspection, to free its "
                        "graph sooner."}
        out.append(f)
    return out


@dataclass
class _Observed:
    """The one step of diagnose, run with every observer active, and the observers (what each saw)."""

    tracer: GradTracer
    grads: GradRecorder
    step: StepResult
    buffers: dict[str, Any]  # float buffers: name -> (buffer, module)
    capture: Any  # gradcheck's ApplyWatch: custom Functions called, with their inputs
    direct: Any  # gradcheck's DirectForwardWatch: Function.forward called directly
    base_obs: Any  # prompt_tuning's BaseObserver of the HF base model, or None
    use: Any  # prompt_tuning's PromptUse: learned values the user's code placed into the token sequence
    opt: torch.optim.Optimizer | None
    before: Any  # the optimizer's snapshot of the model before the step, or None
    step_obs: Any  # optimizer.StepObserver of step() and zero_grad() calls, or None
    amp: autocast_underflow.AutocastWatch  # the autocasts the step entered, and whether a GradScaler scaled the loss
    frozen: frozen_init.PathWatch  # whether the loss's graph reaches modules frozen at their initialisation (GP123)


def _observe(loaded: Any, prompt_on: bool, shared: storage.StorageFacts) -> _Observed:
    """Run the step once with the trace mode, the gradient hooks, the optimizer, Function and base-model observers."""
    model = loaded.model
    base = prompt_tuning.find_base(model) if prompt_on else None
    opt = loaded.optimizer if isinstance(loaded.optimizer, torch.optim.Optimizer) else None
    before = optimizer.snapshot(model) if opt is not None else None
    tracer = GradTracer(model, loaded.user, provenance=prompt_on)
    grads = GradRecorder(model)
    tracer.watch_plain(registration.plain_tensor_attributes(model))
    buffers = registration.float_buffers(model)
    tracer.watch_plain({n: b for n, (b, _) in buffers.items()})
    capture = gradcheck.ApplyWatch(loaded.user, {i: n[0] for i, n in param_names(model).items()}, capture=True)
    direct = gradcheck.DirectForwardWatch(loaded.user)
    base_obs = prompt_tuning.BaseObserver(base, loaded.user) if base is not None else None
    use = prompt_tuning.PromptUse(model, loaded.user, base)
    amp = autocast_underflow.AutocastWatch(model, loaded.user)
    frozen = frozen_init.measure(model, loaded.record)[1]
    with contextlib.ExitStack() as stack:
        # where the step itself sets module attributes: lazily created state, parameters replaced on the first call
        stack.enter_context(BuildRecorder(loaded.user, loaded.record, writes=False))
        step_obs = (stack.enter_context(optimizer.StepObserver(model, opt, loaded.user, loaded.record))
                    if opt is not None else None)
        stack.enter_context(capture)
        stack.enter_context(direct)
        if base_obs is not None:
            stack.enter_context(base_obs)
        stack.enter_context(use)
        stack.enter_context(amp)
        stack.enter_context(storage.StorageStep(shared, opt))  # GP805: the update of a storage two Parameters share
        stack.enter_context(frozen)
        step = trace.observed_step(loaded, tracer, grads, optimizer_step=opt is not None)
    frozen.settle(tracer.backward_roots)
    return _Observed(tracer, grads, step, buffers, capture, direct, base_obs, use, opt, before, step_obs, amp, frozen)


def _not_stepped(loaded: Any, findings: list[Finding], facts: dict[str, Any]) -> bool:
    """Whether the step-based checks cannot run (no inputs, or the optimizer train_step needs failed); says why."""
    if loaded.batch is None and loaded.train_step is None:
        several = (loaded.info.get("models") or {}) if isinstance(getattr(loaded, "info", None), dict) else {}
        facts["note"] = several.get("note") or "no inputs and no train_step: the step-based checks were skipped"
        if "script_step" in (loaded.info or {}):  # a script's step that gradprobe could not replay: ours
            add_not_run(facts, STEP_CHECKS, "gradprobe found no call of the model with grad enabled to replay the "
                        "script's step on", "gradprobe")
        else:
            add_not_run(facts, STEP_CHECKS, several.get("note") or "the target gives no inputs and no train_step to run "
                        "a step with (give `inputs`, make_inputs in the model's file, or a `train_step`)", "refused")
        return True
    if loaded.optimizer_error is not None and loaded.train_step is not None and loaded.optimizer is None:
        # reported once above, as the root: train_step cannot run without the optimizer it takes
        facts["note"] = "make_optimizer failed, so train_step was not run: the step-based checks were skipped"
        add_not_run(facts, STEP_CHECKS, "make_optimizer failed, so train_step (which takes the optimizer) was not run",
                    "user_code")
        found = prompt_tuning.find_prompt(loaded.model, used=prompt_tuning.forward_watched(loaded))
        if found.any:
            findings += prompt_tuning.nonleaf_prompt_findings(loaded, found.attrs)
        return True
    return False


def _registration_after_step(loaded: Any, seen: _Observed, findings: list[Finding],
                             coverage: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """Coverage settled by the gradients that arrived, how plain tensors and buffers were used, state the step set."""
    model, tracer, step = loaded.model, seen.tracer, seen.step
    if coverage and not step.failed and tracer.backward_calls and tracer.backward_error is None:
        settled = optimizer.settle_coverage(coverage, model, set(seen.grads.got))
        findings = [f for f in findings if not any(f is c for c in coverage)] + settled
        coverage = settled
    findings += registration.plain_tensor_findings(model, tracer.plain_uses, loaded.record)
    buffer_uses = registration.buffer_use_findings(model, seen.buffers, tracer.plain_uses, loaded.record)
    named = {p for f in findings if f["code"] == "GP104" for p in f["parameters"]}
    findings += [f for f in buffer_uses if not set(f["parameters"]) <= named]
    findings += _after_step(loaded, seen.opt, findings)
    registration.settle_buffers(findings, model, set(seen.grads.got))
    return findings, coverage


def _gradcheck(loaded: Any, seen: _Observed, tfacts: dict[str, Any], facts: dict[str, Any]) -> list[Finding]:
    """gradcheck of the custom Functions the step called (not after a memory limit: it would run them again)."""
    if not (seen.capture.calls or seen.direct.hits):
        return []
    if seen.step.resource_limit is not None:
        # the step ran out of memory: gradcheck would run the same Functions again (in float64), so it is left out
        facts["gradcheck"] = {"skipped": "the step was stopped by a memory limit (GP113)"}
        add_not_run(facts, "gradcheck of the custom autograd Functions", "the step was stopped by a memory limit (GP113)",
                    "refused")
        return []
    starved = frozenset(r["name"] for r in tfacts.get("per_parameter", []) if r["grad"] == "none")
    gfindings, gfacts = gradcheck.gradcheck_findings(loaded, seen.capture, seen.direct, starved=starved)
    lift(facts, gfacts)
    facts["gradcheck"] = gfacts
    facts["checks"].append("gradcheck")
    return gfindings


def diagnose_findings(loaded: Any) -> tuple[list[Finding], dict[str, Any]]:
    model = loaded.model
    findings: list[Finding] = registration.check_registration(model, loaded.record, loaded.info, user=loaded.user)
    facts: dict[str, Any] = {"checks": ["registration"]}
    add_verified(facts, registration.registration_line(model))
    coverage: list[Finding] = []
    shared = storage.measure_storage(model, loaded.optimizer, loaded.record)
    facts.setdefault("verified", []).append(storage.verified_line(shared))
    if loaded.optimizer_error is not None or loaded.optimizer is not None:
        coverage, ofacts = optimizer.optimizer_findings(loaded, step=False, storage=False)
        lift(facts, ofacts)
        findings += coverage
        facts["optimizer"] = ofacts
        facts["checks"].append("optimizer")
    else:
        add_not_run(facts, "optimizer coverage", "the target gives no optimizer (`optimizer`, or make_optimizer in the "
                    "model's file): the optimizer checks apply to the optimizer it names", "not_applicable")
    if _not_stepped(loaded, findings, facts):
        facts["shared_storage"] = storage.facts_dict(shared)
        return findings + storage.storage_findings(shared), facts
    nonleaf_before = {f["evidence"]["attribute"]: _attribute(model, f["evidence"]["attribute"])
                      for f in findings if f["code"] == "GP109" and "attribute" in f["evidence"]}
    found = prompt_tuning.find_prompt(model)
    # a mostly frozen model alone is no prompt tuning, PEFT or not: adapters (LoRA, IA3, ...) feed no input positions;
    # the input embedding trained alone in a frozen LM is (new token embeddings as the tuning mechanism). A prompt of
    # the user's own is recognised by what the step does with it: the base is watched where the user's code may place one
    watch = (found.any and found.how in ("caller", "peft", "embedding")) or prompt_tuning.may_place_prompt(model, loaded.user)
    seen = _observe(loaded, watch, shared)
    findings += storage.storage_findings(shared)  # after the step: with the update it measured
    facts["shared_storage"] = storage.facts_dict(shared)
    found = prompt_tuning.find_prompt(model, used=seen.use)
    prompt_on = prompt_tuning.tunes_a_prompt(model, found)
    tracer, step = seen.tracer, seen.step
    findings = _forward_caches(findings, model, nonleaf_before)
    tfindings, tfacts = trace.analyze(tracer, seen.grads, model, step, record=loaded.record, optimizer=loaded.optimizer)
    findings, coverage = _registration_after_step(loaded, seen, findings, coverage)
    findings += tfindings
    lift(facts, tfacts)
    facts.update(tfacts)
    facts["checks"].append("trace")
    if seen.step_obs is not None and seen.before is not None and step.error is None and tracer.backward_error is None:
        findings += optimizer.analyze_step(model, seen.opt, seen.before, seen.step_obs, coverage,
                                           optimizer._opt_site(loaded.record, seen.opt)[1])
        facts["step_events"] = seen.step_obs.events[:50]
        if not step.failed:
            moved, measured = optimizer.moved_count(model, seen.before)
            add_verified(facts, f"one real optimizer step: {moved} of {measured} trainable parameter(s) changed")
    if step.error is None:  # after the step's own measurements: a graph the model keeps for the next call (GP119)
        findings += carried_graph_findings(loaded, tracer)
    findings += _gradcheck(loaded, seen, tfacts, facts)
    findings += run_rules((frozen_init.GP123,), seen.frozen.facts)  # a module frozen at its initialisation on the path
    verified, not_run = frozen_init.verdict_lines(seen.frozen.facts, sum(not p.requires_grad for p in model.parameters()),
                                                  bool(tracer.backward_calls) and tracer.backward_error is None)
    facts.setdefault("verified", []).extend(verified)
    facts.setdefault("not_run", []).extend(not_run)
    if not prompt_on:
        findings += prompt_tuning.checkpoint_findings(tracer, tfacts)
    else:
        run = trace.TraceRun(tfindings, tfacts, tracer, seen.grads, step)
        pfindings, pfacts = prompt_tuning.prompt_findings(loaded, run, seen.base_obs, found)
        lift(facts, pfacts)
        findings += pfindings
        facts["prompt_tuning"] = pfacts
        facts["checks"].append("prompt_tuning")
    for name, scale in (("compiled", compiled.compiled_findings), ("precision", precision.precision_findings)):
        sfindings, sfacts = scale(loaded)  # GP701 (torch.compile against eager), GP702 (fp16/bf16 parameters)
        if sfacts is not None:
            findings, facts[name] = findings + sfindings, sfacts
            facts["checks"].append(name)
            subcheck_verdict(facts, name, sfacts)
    afindings, afacts = autocast_underflow.underflow_findings(loaded, seen.amp, step.failed)  # GP708: fp16 underflow
    if afacts is not None:
        findings, facts["autocast"] = findings + afindings, afacts
        facts["checks"].append("autocast")
        subcheck_verdict(facts, "autocast", afacts)
    if not step.failed:
        findings += _dependencies(loaded, facts)
    return _scaler_backoff(findings, seen.amp), facts


def _dependencies(loaded: Any, facts: dict[str, Any]) -> list[Finding]:
    """GP9xx where the model claims an independence (next element, examples, packed examples): measured after the step,
    on the weights it left; facts.dependencies says whether it ran, what it verified and what it cost."""
    from gradprobe.checks.dependencies.engine import dependency_findings

    try:
        dfindings, dfacts = dependency_findings(loaded)
    except Exception as exc:  # ours: the step ran; the probe is left out and said so
        facts["dependencies"] = {"ran": False, "left_out": f"{type(exc).__name__}: {exc}"[:300]}
        add_not_run(facts, "the dependency check (GP9xx)", f"gradprobe's probe raised {type(exc).__name__}: {exc}"[:300],
                    "gradprobe")
        return []
    facts["dependencies"] = dfacts
    if dfacts["ran"]:
        facts["checks"].append("dependencies")
    lift(facts, dict(dfacts))  # what it verified (the dependencies measured, positions sampled) and what did not run
    return dfindings


def _scaler_backoff(findings: list[Finding], amp: autocast_underflow.AutocastWatch) -> list[Finding]:
    """A GradScaler multiplied a finite loss: NaN/Inf gradients at its scale (GP307) and the step it then skipped
    (GP207, not stepped) are how GradScaler backs off at the start of fp16 training, not the user's error."""
    scaled = amp.scaler.facts.scaled
    if not scaled or not all(s.value is not None and math.isfinite(s.value) and s.scale for s in scaled):
        return findings
    last = scaled[-1]
    scale, loss = float(last.scale or 0.0), float(last.value or 0.0)
    if scale <= 1.0:  # at a scale of 1 or less the overflow is the model's own
        return findings
    out: list[Finding] = []
    for f in findings:
        if f["code"] == GP307.code and f["severity"] == "error":
            f = scaler_overflow(f, loss, scale, at(last.location))
        elif f["code"] == GP207.code and f["evidence"].get("reason") == NOT_STEPPED:
            f = scaler_skipped(f, scale)
        out.append(f)
    return out


def _after_step(loaded: Any, opt: Any, before: list[Finding]) -> list[Finding]:
    """Inspect again after the observed step: state the forward created or replaced is invisible before it."""
    seen = {(f["code"], tuple(f["parameters"])) for f in before}
    new: list[Finding] = []
    for f in registration.check_registration(loaded.model, loaded.record, loaded.info, user=loaded.user):
        # a non-leaf attribute the forward stored (GP109's shape) is an activation cache, not a lost parameter
        if (f["code"], tuple(f["parameters"])) not in seen and f["code"] in ("GP101", "GP102", "GP103", "GP104"):
            f["evidence"]["created_during_step"] = True
            f["message"] += " (set during the step: created by the forward, not in __init__)"
            new.append(f)
    if opt is not None:
        new += optimizer.replaced_during_step(loaded.model, opt, loaded.record, seen)
    return new


def _unregistered_rows(findings: list[Finding]) -> list[dict[str, Any]]:
    rows = []
    for f in findings:
        if f["code"] in ("GP101", "GP102", "GP103", "GP109", "GP107") and f["severity"] == "error":
            rows += [{"name": n, "read": True, "grad": "none"} for n in f["parameters"]]
    return rows


def diagnose_report(loaded: Any, steps: int = 0) -> dict[str, Any]:
    """Every check on one load; with `steps` > 0 the several-steps audit too (checks/steps/diagnose_steps.py)."""
    findings, facts = diagnose_findings(loaded)
    kept = fold(findings)
    steps_lines: list[str] = []
    if steps > 0 and "note" not in facts:
        from gradprobe.checks.steps.diagnose_steps import add_steps

        kept, steps_lines = add_steps(loaded, steps, kept, facts)
        kept = fold(kept)
    elif "note" not in facts:  # "by design, a zero-initialised partner" is checked over real steps (issue 27, item 6)
        from gradprobe.checks.steps.diagnose_steps import check_by_design

        kept = fold(check_by_design(loaded, kept, facts))
    table = facts.get("per_parameter", [])
    names_in_table = {r["name"] for r in table}
    rows = table + [r for r in _unregistered_rows(kept) if r["name"] not in names_in_table]
    frozen = [n for n, p in loaded.model.named_parameters() if not p.requires_grad]
    facts["flow"] = flow_graph(rows, kept, frozen)
    facts["mermaid"] = flow_mermaid(facts["flow"])
    summary = [f"Checks run: {', '.join(facts['checks'])}."]
    facts["trainable_set"] = tset = trainable_set(loaded.model, loaded.record)
    if tset["tensors"] and tset["trainable"] < tset["tensors"]:  # something frozen: the counts by module
        summary.append(f"Trainable set ({tset['trainable']} of {tset['tensors']} tensors): {compact(tset)}.")
    if facts.get("note"):
        summary.append(facts["note"])
    unregistered = [r["name"] for r in rows if r["name"] not in names_in_table]
    if table:
        bad = [r["name"] for r in table if r["grad"] != "ok"]
        line = f"{len(table)} trainable parameters traced, {len(table) - len(bad)} got a finite nonzero gradient"
        if unregistered:  # what the model does not register is missing from the table, not healthy
            codes = sorted({f["code"] for f in kept if set(f["parameters"]) & set(unregistered)})
            line += (f"; {len(unregistered)} more tensor(s) meant to learn are not registered ({', '.join(codes)}) "
                     "and cannot get a gradient")
        summary.append(line + ".")
    deps = facts.get("dependencies") or {}
    if deps.get("ran") and not any(f["code"].startswith("GP9") and f["severity"] == "error" for f in kept):
        summary += [f"Dependencies verified: {v}" for v in deps.get("verified", [])[:3]]
    return make_report("diagnose", kept, summary + steps_lines, **facts)


def diagnose(model: nn.Module, batch: Any = None, loss_fn: Any = None, optimizer: Any = None, train_step: Any = None,
             project_dir: str | None = None, steps: int = 0) -> dict[str, Any]:
    """Library entry: every applicable check on live objects (`steps` > 0: also that many observed training steps)."""
    from gradprobe.loading import live_target

    return diagnose_report(live_target(model, batch, loss_fn, optimizer, train_step, project_dir), steps=steps)
