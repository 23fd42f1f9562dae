"""GP2xx: does the optimizer hold exactly the model's trainable parameters, and does a step move them?

Coverage is by tensor identity, never by counts: a deep-copied or rebuilt model
has the same counts and shapes but none of the same tensors.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks._step import module_of, param_names, run_step
from gradprobe.checks.torchcompat import (
    OPTIMIZER_EMPTY,
    OPTIMIZER_NON_LEAF,
    OPTIMIZER_PARAM_IN_SEVERAL_GROUPS,
    allocation_failure,
    untraced,
)
from gradprobe.checks.watches import patched
from gradprobe.findings import Finding, make_finding
from gradprobe.report import make_report
from gradprobe.outcomes import resource_limit_finding
from gradprobe.userframes import enclosing_def

RULES = {
    "GP201": {
        "name": "param-not-in-optimizer", "severity": "error", "rank": 33,
        "summary": "A trainable parameter of the model is in no param group (an error when it gets a gradient; info when the measured step gave it none).",
        "why": "optimizer.step() only updates the tensors it was given: the parameter gets a gradient and never changes. One deliberately kept out of training and unused by the step (a calibration temperature) loses nothing: freeze it to say so.",
        "example": "opt = Adam(self.parameters())  # in __init__, before a subclass adds value_head",
        "fix": "Build the optimizer after the model is complete: opt = Adam(model.parameters())",
    },
    "GP202": {
        "name": "stale-optimizer-reference", "severity": "error", "rank": 11,
        "summary": "The optimizer holds tensors that are not the model's current parameters.",
        "why": "After a model is rebuilt, deep-copied, reloaded or a parameter replaced, the optimizer keeps updating the old tensors; the live model never changes.",
        "example": "model.encoder = copy.deepcopy(pretrained_encoder)  # after the optimizer was built",
        "fix": "Load the new weights into the existing module (module.load_state_dict(new.state_dict())) or build the optimizer after replacing modules.",
    },
    "GP203": {
        "name": "frozen-param-in-optimizer", "severity": "info", "rank": 99,
        "summary": "The optimizer holds parameters with requires_grad=False.",
        "why": "Harmless by itself (they get no gradient), but weight decay may still change them in some optimizers, and it often means the freeze happened after the optimizer was built.",
        "example": "opt = AdamW(model.parameters()); model.backbone.requires_grad_(False)",
        "fix": "Pass only trainable parameters: AdamW(p for p in model.parameters() if p.requires_grad)",
    },
    "GP204": {
        "name": "duplicate-param-in-optimizer", "severity": "error", "rank": 14,
        "summary": "One parameter in several param groups.",
        "why": "Recent PyTorch refuses it; older versions update the tensor twice per step with different hyperparameters.",
        "example": "Adam([{'params': model.parameters()}, {'params': model.head.parameters(), 'lr': 1e-2}])",
        "fix": "Partition the parameters so each appears in exactly one group.",
    },
    "GP205": {
        "name": "zero-learning-rate", "severity": "warning", "rank": 99,
        "summary": "A param group with lr == 0.",
        "why": "Its parameters get gradients but never move.",
        "example": "{'params': model.encoder.parameters(), 'lr': 0.0}",
        "fix": "Give the group a positive lr, or freeze those parameters explicitly with requires_grad_(False).",
    },
    "GP206": {
        "name": "non-leaf-in-optimizer", "severity": "error", "rank": 12,
        "summary": "A non-leaf tensor handed to the optimizer.",
        "why": "Non-leaf tensors never receive .grad, so the optimizer cannot update them (torch refuses them).",
        "example": "SGD([w.cuda()], lr=0.1)  # w.cuda() is a copy with a grad_fn",
        "fix": "Optimize the leaf: w = nn.Parameter(x.cuda()); SGD([w], lr=0.1)",
    },
    "GP207": {
        "name": "param-not-updated", "severity": "error", "rank": 37,
        "summary": "After one real step a parameter with a nonzero gradient did not change.",
        "why": "Something between backward() and step() lost the update: zero lr, zero_grad between backward and step, a skipped GradScaler step, or the parameter missing from the optimizer.",
        "example": "loss.backward(); optimizer.zero_grad(); optimizer.step()",
        "fix": "Call optimizer.zero_grad() before backward(), then optimizer.step() right after backward().",
    },
    "GP208": {
        "name": "empty-optimizer", "severity": "error", "rank": 13,
        "summary": "The optimizer holds no parameters.",
        "why": "Nothing is updated; often a generator (model.parameters()) consumed twice, or a name filter that matched nothing.",
        "example": "params = model.parameters(); n = len(list(params)); Adam(params)",
        "fix": "Materialise the parameters once: params = list(model.parameters()); Adam(params)",
    },
    "GP209": {
        "name": "unsupported-optimizer", "severity": "warning", "rank": 99,
        "summary": "The optimizer is not a torch.optim.Optimizer (or updates outside step()), so the step check cannot observe it.",
        "why": "The step check watches Optimizer.step and zero_grad; coverage by identity still applies where its parameters can be read.",
        "example": "class MyOpt: def update(self): ...  # not a torch.optim.Optimizer",
        "fix": "Subclass torch.optim.Optimizer (or wrap the update in one) so its step can be observed.",
    },
}


def _gp202_fix(modules: list[str]) -> str | None:
    """GP202's fix in the user's own names: the replaced modules, loaded in place."""
    mods = [m for m in modules if m][:3]
    if not mods:
        return None
    return (f"Load the new weights into the existing module ({'; '.join(f'model.{m}.load_state_dict(new.state_dict())' for m in mods)}) "
            "instead of assigning a new one, or build the optimizer after the replacement.")

def _opt_site(loaded_record, optimizer):
    if loaded_record is None:
        return None, None
    hit = loaded_record.optimizer_sites.get(id(optimizer))
    return hit if hit else (None, None)


def _replacement_site(record, model: nn.Module, name: str, after_seq: int | None, opt_site: dict | None = None):
    """The user line that assigned a module on `name`'s path after the optimizer was built.

    When that assignment ran inside a call made from the function that built the optimizer (a
    `model.crop_block_size(...)` after `AdamW(...)`), the line in that function is the one to move."""
    if record is None:
        return None
    parts = name.split(".")
    best = None
    for i in range(len(parts), 0, -1):
        owner_path, attr = ".".join(parts[: i - 1]), parts[i - 1]
        try:
            owner = model.get_submodule(owner_path) if owner_path else model
        except AttributeError:
            continue
        hit = record.setattr_sites.get((id(owner), attr))
        if hit and (after_seq is None or hit[0] > after_seq):
            best = hit[1]
            stack = getattr(record, "setattr_stacks", {}).get((id(owner), attr)) or []
            if opt_site is not None:
                best = next((f for f in stack if f["file"] == opt_site.get("file")
                             and f["function"] == opt_site.get("function")), best)
    return best


def _first_replacement_site(record, model: nn.Module, names: list[str], after_seq: int | None, opt_site: dict | None):
    """The replacing line (see _replacement_site) of the first of `names` that has one."""
    return next((loc for loc in (_replacement_site(record, model, n, after_seq, opt_site) for n in names) if loc), None)


def _frozen_site(record, tensors: list) -> dict | None:
    """The user line that froze most of `tensors`, if the build recorded it."""
    table = getattr(record, "frozen_sites", None) or {}
    hits = [table[id(t)][1] for t in tensors if id(t) in table]
    if not hits:
        return None
    lines = [(h["file"], h["line"]) for h in hits]
    top = max(set(lines), key=lines.count)
    return hits[lines.index(top)]


def check_coverage(model: nn.Module, optimizer, record=None) -> tuple[list[Finding], list[dict]]:
    """Identity comparison of optimizer groups with the model's parameters."""
    findings: list[Finding] = []
    if not isinstance(optimizer, torch.optim.Optimizer):
        findings.append(make_finding(
            "GP100", f"The optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer: its coverage cannot be checked.",
            evidence={"type": f"{type(optimizer).__module__}.{type(optimizer).__name__}"},
            fix="make_optimizer(model) must return a torch.optim.Optimizer (e.g. torch.optim.AdamW(model.parameters())).",
        ))
        return findings, []
    names = param_names(model)
    seq, site = _opt_site(record, optimizer)
    groups: list[dict] = []
    seen: dict[int, Any] = {}
    dupes: list[tuple[str, int, int]] = []
    stale: list[torch.Tensor] = []
    frozen: list[str] = []
    nonleaf: list[str] = []
    for gi, group in enumerate(optimizer.param_groups):
        gnames = []
        for t in group["params"]:
            n = names.get(id(t), [None])[0]
            gnames.append(n or f"<tensor {tuple(t.shape)} not in the model>")
            if id(t) in seen and seen[id(t)] != gi:
                dupes.append((n or str(tuple(t.shape)), seen[id(t)], gi))
            seen.setdefault(id(t), gi)
            if n is None:
                stale.append(t)
            elif not t.requires_grad:
                frozen.append(n)
            if not t.is_leaf:
                nonleaf.append(n or str(tuple(t.shape)))
        groups.append({"index": gi, "lr": group.get("lr"), "weight_decay": group.get("weight_decay"),
                       "tensors": len(group["params"]), "names": gnames})
        if group.get("lr") == 0:
            findings.append(make_finding(
                "GP205", f"param group {gi} has lr=0: its {len(group['params'])} tensors never move.",
                parameters=[g for g in gnames if not g.startswith("<")], location=site,
                evidence={"group": gi, "lr": 0},
            ))
    total = sum(len(g["params"]) for g in optimizer.param_groups)
    if total == 0:
        findings.append(make_finding(
            "GP208", f"{type(optimizer).__name__} holds no parameters.", location=site,
            evidence={"param_groups": len(optimizer.param_groups)},
        ))
    trainable = [(n[0], p) for n, p in ((names[id(p)], p) for p in model.parameters()) if p.requires_grad]
    missing = [(n, p) for n, p in trainable if id(p) not in seen]
    if stale:
        # pair each stale tensor with the missing parameter it most likely was: same shape, same order
        pool = list(missing)
        guesses: list[dict[str, Any]] = []
        for t in stale:
            match = next((m for m in pool if tuple(m[1].shape) == tuple(t.shape)), None)
            if match is not None:
                pool.remove(match)
            guesses.append({"shape": list(t.shape), "likely_was": match[0] if match else None})
        replaced = [g["likely_was"] for g in guesses if g["likely_was"]]
        # a parameter set on its module after the optimizer was built replaced one too, whatever its shape
        # (a crop or resize that makes a new, smaller Parameter)
        if seq is not None:
            replaced += [n for n, _ in pool if n not in replaced and _replacement_site(record, model, n, seq) is not None]
        loc = _first_replacement_site(record, model, replaced, seq, site)
        findings.append(make_finding(
            "GP202",
            f"{type(optimizer).__name__} holds {len(stale)} tensor(s) that are not the model's current parameters; "
            + (f"they were {', '.join(replaced[:6])}{'...' if len(replaced) > 6 else ''} (by shape and order, or by "
               "the line that replaced them), which the model has since replaced (rebuilt, deep-copied, reloaded or "
               "resized)." if replaced else "the model was rebuilt or a parameter replaced."),
            parameters=replaced, location=loc or site,
            evidence={"stale_tensors": guesses, "optimizer_created_at": site},
            fix=_gp202_fix(sorted({module_of(n) for n in replaced})),
        ))
        missing_stale = {n for n in replaced}
    else:
        missing_stale = set()
    rest = [(n, p) for n, p in missing if n not in missing_stale]
    if rest or (missing and not stale):
        by_module: dict[str, int] = {}
        for n, p in rest:
            by_module[module_of(n)] = by_module.get(module_of(n), 0) + p.numel()
        # a module set after the optimizer was built, later in the same function (a replaced embedding): that line is
        # the one to move. Set by other code (a subclass adding a head after its base built the optimizer): the
        # optimizer's line is, as the optimizer was built before the model was complete
        added_at = _first_replacement_site(record, model, [n for n, _ in rest], seq, site) if seq is not None and site else None
        if added_at and not (added_at["file"] == site["file"]
                             and enclosing_def(site["file"], site["line"]) == enclosing_def(added_at["file"], added_at["line"])):
            added_at = None
        findings.append(make_finding(
            "GP201",
            f"{len(rest)} trainable parameter(s) are in no param group of {type(optimizer).__name__}: "
            f"{', '.join(n for n, _ in rest[:6])}{'...' if len(rest) > 6 else ''}. They get gradients but step() never updates them."
            + (f" They were set on the model at line {added_at['line']} of {added_at['file'].rsplit('/', 1)[-1]}, after the "
               "optimizer was built." if added_at else ""),
            parameters=[n for n, _ in rest], location=added_at or site,
            evidence={"missing": len(rest), "missing_numel_by_module": by_module, "optimizer_created_at": site,
                      "set_after_optimizer_at": added_at,
                      "optimizer_tensors": total, "model_trainable": len(trainable)},
            fix="Build the optimizer after the model is complete, from model.parameters() "
                "(or add a group: optimizer.add_param_group({'params': module.parameters()})).",
        ))
    elif missing and stale:
        # every missing parameter is explained by GP202; keep GP201 as its consequence
        findings[-1]["evidence"]["related"] = [{"code": "GP201", "parameters": [n for n, _ in missing]}]
    if dupes:
        findings.append(make_finding(
            "GP204", f"{len(dupes)} parameter(s) appear in more than one param group.",
            parameters=[d[0] for d in dupes], location=site,
            evidence={"duplicates": [{"name": d[0], "groups": [d[1], d[2]]} for d in dupes]},
        ))
    if frozen:
        # where they were frozen says more than where the optimizer was built (that line is in the evidence)
        frozen_at = _frozen_site(record, [t for g in optimizer.param_groups for t in g["params"] if not t.requires_grad])
        findings.append(make_finding(
            "GP203", f"The optimizer holds {len(frozen)} frozen parameter(s) (requires_grad=False)"
            + (f", frozen at line {frozen_at['line']} of {frozen_at['file'].rsplit('/', 1)[-1]}." if frozen_at else "."),
            parameters=frozen, location=frozen_at or site, evidence={"frozen": len(frozen), "optimizer_created_at": site},
        ))
    if nonleaf:
        findings.append(make_finding(
            "GP206", f"The optimizer holds {len(nonleaf)} non-leaf tensor(s); they never receive .grad.",
            parameters=nonleaf, location=site, evidence={"non_leaf": nonleaf},
        ))
    return findings, groups


def replaced_during_step(model: nn.Module, optimizer, record, seen: set[tuple]) -> list[Finding]:
    """GP202 for parameters the step itself replaced (a data-dependent init swapping in new nn.Parameter objects
    on the first call, after the optimizer was built); `seen` holds (code, parameters) already reported."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return []
    out = []
    for f in check_coverage(model, optimizer, record)[0]:
        if f["code"] == "GP202" and (f["code"], tuple(f["parameters"])) not in seen:
            f["message"] += " The replacement happened during the step (e.g. a data-dependent initialisation on the first call)."
            f["evidence"]["replaced_during_step"] = True
            f["fix"] = ("Initialise in place so the optimizer keeps the same tensors (with torch.no_grad(): "
                        "self.<param>.copy_(<value>)), or build the optimizer after the first forward.")
            out.append(f)
    return out


def settle_coverage(coverage: list[Finding], model: nn.Module, got_grad: set[int]) -> list[Finding]:
    """After a measured step, GP201 stays an error only for the parameters that got a gradient there.

    A trainable parameter outside the optimizer that the step gave no gradient (a calibration temperature
    fitted after training, a head used only in eval) loses nothing in this step: it is said as info.
    """
    names = param_names(model)
    by_name = {ns[0]: pid for pid, ns in names.items()}
    out: list[Finding] = []
    for f in coverage:
        if f["code"] != "GP201":
            out.append(f)
            continue
        fed = [n for n in f["parameters"] if by_name.get(n) in got_grad]
        idle = [n for n in f["parameters"] if by_name.get(n) not in got_grad]
        if fed:
            out.append(make_finding(
                "GP201",
                f"{len(fed)} trainable parameter(s) got a gradient in this step but are in no param group of the optimizer: "
                f"{', '.join(fed[:6])}{'...' if len(fed) > 6 else ''}. step() never updates them.",
                parameters=fed, location=f["location"], evidence={**f["evidence"], "missing": len(fed), "got_gradient": True},
                fix=f["fix"]))
        if idle:
            info = make_finding(
                "GP201",
                f"{len(idle)} trainable parameter(s) are in no param group and got no gradient in this step: "
                f"{', '.join(idle[:6])}{'...' if len(idle) > 6 else ''}. Nothing is lost in this step; if they are "
                "deliberately kept out of training, freeze them (requires_grad_(False)) to say so.",
                parameters=idle, location=f["location"], evidence={**f["evidence"], "missing": len(idle), "got_gradient": False},
                fix="If they should learn, add them to the optimizer; if not, p.requires_grad_(False).")
            info["severity"] = "info"
            out.append(info)
    return out


def _grad_max(p) -> float:
    with untraced():  # not the user's ops: invisible to a trace running beside us
        return float(p.grad.abs().max()) if p.grad is not None and p.grad.numel() else 0.0


class StepObserver:
    """Records zero_grad/step calls and each parameter's gradient at step() time."""

    def __init__(self, model: nn.Module, optimizer, user=None):
        self.model, self.optimizer, self.user = model, optimizer, user
        self.events: list[str] = []
        self.sites: dict[int, dict | None] = {}  # event index -> the user line of a zero_grad call
        self.grad_at_step: dict[int, float] = {}
        self.grad_after_backward: dict[int, float] = {}

    def __enter__(self):
        orig_zero, orig_mzero = torch.optim.Optimizer.zero_grad, nn.Module.zero_grad
        events, sites, user = self.events, self.sites, self.user

        def opt_zero(opt, *a, **k):
            if user is not None:
                sites[len(events)] = user.innermost(skip=2)
            events.append("optimizer.zero_grad")
            return orig_zero(opt, *a, **k)

        def mod_zero(mod, *a, **k):
            if user is not None:
                sites[len(events)] = user.innermost(skip=2)
            events.append("model.zero_grad")
            return orig_mzero(mod, *a, **k)

        stack = self._stack = contextlib.ExitStack()
        stack.enter_context(patched(torch.optim.Optimizer, "zero_grad", opt_zero))
        stack.enter_context(patched(nn.Module, "zero_grad", mod_zero))
        if isinstance(self.optimizer, torch.optim.Optimizer):
            stack.callback(self.optimizer.register_step_pre_hook(self._pre_step).remove)
        for p in self.model.parameters():
            if p.requires_grad:
                stack.callback(p.register_post_accumulate_grad_hook(self._accumulated).remove)
        return self

    def _accumulated(self, p):
        if "backward" not in self.events[-1:]:
            self.events.append("backward")
        self.grad_after_backward[id(p)] = _grad_max(p)

    def _pre_step(self, opt, args, kwargs):
        self.events.append("optimizer.step")
        for p in self.model.parameters():
            self.grad_at_step[id(p)] = _grad_max(p)

    def __exit__(self, *exc):
        self._stack.close()
        return False


def snapshot(model: nn.Module) -> dict[int, torch.Tensor]:
    return {id(p): p.detach().clone() for p in model.parameters() if p.requires_grad}


def _zeroed_between_at(obs: StepObserver) -> dict | None:
    """The user line of the zero_grad() that ran after the last backward() and before step()."""
    ev = obs.events
    if "optimizer.step" not in ev:
        return None
    stop = ev.index("optimizer.step")
    start = max((i for i in range(stop) if ev[i] == "backward"), default=-1)
    return next((obs.sites.get(i) for i in range(stop - 1, start, -1) if ev[i].endswith("zero_grad")), None)


def analyze_step(model: nn.Module, optimizer, before: dict, obs: StepObserver, coverage: list[Finding],
                 opt_site: dict | None = None) -> list[Finding]:
    """GP207: parameters with a nonzero gradient after backward that one real step left unchanged, and why."""
    names = param_names(model)
    in_opt = {id(t) for g in optimizer.param_groups for t in g["params"]}
    lr_of = {id(t): g.get("lr") for g in optimizer.param_groups for t in g["params"]}
    already = {n for f in coverage if f["code"] in ("GP201", "GP202") for n in f["parameters"]}
    stuck: dict[str, list[str]] = {}
    stepped = "optimizer.step" in obs.events
    for p in model.parameters():
        if id(p) not in before:
            continue
        g = obs.grad_after_backward.get(id(p), 0.0)
        if g <= 0.0 or not torch.equal(before[id(p)], p.detach()):
            continue
        name = names[id(p)][0]
        if name in already:
            continue
        if id(p) not in in_opt:
            reason = "not in the optimizer"
        elif not stepped:
            reason = "optimizer.step() was not called (or a GradScaler skipped it after inf/NaN gradients)"
        elif lr_of.get(id(p)) == 0:
            reason = "its param group has lr=0"
        elif obs.grad_at_step.get(id(p), 0.0) == 0.0:
            reason = "its gradient was zeroed between backward() and step()"
        else:
            reason = "step() ran with a nonzero gradient but the value did not change"
        stuck.setdefault(reason, []).append(name)
    where = {"not in the optimizer": opt_site, "its param group has lr=0": opt_site,
             "its gradient was zeroed between backward() and step()": _zeroed_between_at(obs)}
    out = []
    for reason, params in stuck.items():
        at = where.get(reason)
        out.append(make_finding(
            "GP207", f"{len(params)} parameter(s) had a nonzero gradient after backward() but did not change in one real step: {reason}"
            + (f" (line {at['line']} of {at['file'].rsplit('/', 1)[-1]})." if at else "."),
            parameters=params, location=at, evidence={"reason": reason, "call_order": obs.events[:30]},
        ))
    return out


def check_step(loaded, coverage: list[Finding]) -> tuple[list[Finding], dict]:
    """Run one real step and report parameters with a nonzero gradient that did not change (GP207)."""
    from gradprobe.loading import BuildRecorder

    before = snapshot(loaded.model)
    with StepObserver(loaded.model, loaded.optimizer, loaded.user) as obs, BuildRecorder(loaded.user, loaded.record):
        result = run_step(loaded, optimizer_step=True)
    coverage += replaced_during_step(loaded.model, loaded.optimizer, loaded.record,
                                     {(f["code"], tuple(f["parameters"])) for f in coverage})
    err = result.error
    facts = {"events": obs.events[:50],
             "step_error": f"{type(err).__name__}: {err}" if err is not None else result.loss_problem}
    if result.resource_limit is not None:  # a memory limit stopped the step: nothing about updates is measured
        return [resource_limit_finding("running one real step (forward, backward, optimizer.step)", result.resource_limit,
                                       location=result.error_location, evidence={"traceback": result.error_traceback})], facts
    if result.failed:
        return [], facts
    coverage[:] = settle_coverage(coverage, loaded.model, set(obs.grad_after_backward))
    return analyze_step(loaded.model, loaded.optimizer, before, obs, coverage,
                        _opt_site(loaded.record, loaded.optimizer)[1]), facts


def check_optimizer_coverage(model: nn.Module, optimizer, batch=None, loss_fn=None, train_step=None, step: bool = True,
                             project_dir: str | None = None) -> dict:
    """Library entry: coverage by identity, plus one real step when a batch or train_step is given."""
    from gradprobe.loading import live_target

    loaded = live_target(model, batch, loss_fn, optimizer, train_step, project_dir)
    return optimizer_report(loaded, step=step and (batch is not None or train_step is not None))


def optimizer_findings(loaded, step: bool = True) -> tuple[list[Finding], dict]:
    if loaded.optimizer_error is not None:
        exc = loaded.optimizer_error
        text = str(exc.cause or exc)
        loc = loaded.user.innermost_of_traceback(exc.cause) if exc.cause is not None else None
        if OPTIMIZER_EMPTY in text:
            return [make_finding("GP208", f"make_optimizer failed: the optimizer got an empty parameter list ({text}).", location=loc,
                                 evidence={"error": text})], {}
        if OPTIMIZER_PARAM_IN_SEVERAL_GROUPS in text:
            return [make_finding("GP204", f"make_optimizer failed: {text}. A parameter appears in several param groups.", location=loc,
                                 evidence={"error": text})], {}
        if OPTIMIZER_NON_LEAF in text:
            return [make_finding("GP206", f"make_optimizer failed: {text}", location=loc, evidence={"error": text})], {}
        limit = allocation_failure(exc.cause)
        if limit is not None:
            return [resource_limit_finding("making the optimizer", limit, location=loc,
                                           evidence={"traceback": loaded.user.trimmed_traceback(exc.cause)})], {}
        return [make_finding("GP100", f"make_optimizer failed: {text}", location=loc,
                             evidence={"traceback": loaded.user.trimmed_traceback(exc.cause) if exc.cause else text})], {}
    if loaded.optimizer is None:
        return [], {"note": "the target has no optimizer: only registration-level facts apply"}
    findings, groups = check_coverage(loaded.model, loaded.optimizer, loaded.record)
    facts: dict[str, Any] = {"optimizer": type(loaded.optimizer).__name__, "param_groups": groups}
    if step and isinstance(loaded.optimizer, torch.optim.Optimizer) and (loaded.batch is not None or loaded.train_step is not None):
        more, step_facts = check_step(loaded, findings)
        findings += more
        facts["step"] = step_facts
    return findings, facts


def optimizer_report(loaded, step: bool = True) -> dict:
    findings, facts = optimizer_findings(loaded, step)
    summary = []
    if "note" in facts:
        summary.append("No optimizer in the target: give `optimizer` (a callable taking the model) or define make_optimizer.")
    elif "param_groups" in facts:
        groups = facts["param_groups"]
        summary.append(f"{facts['optimizer']} with {len(groups)} group(s): " + "; ".join(
            f"lr={g['lr']} wd={g['weight_decay']} tensors={g['tensors']}" for g in groups))
    return make_report("check_optimizer_coverage", findings, summary, **facts)
