"""GP2xx: does the optimizer hold exactly the model's trainable parameters, and does a step move them?

Coverage is by tensor identity, never by counts: a deep-copied or rebuilt model
has the same counts and shapes but none of the same tensors. Three stages: measure the
coverage (`CoverageFacts`), run the rules over it, and settle GP201 once a step was measured.
Whether one real step moved the parameters is checks/optimizer/param_updates.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import module_of, param_names, run_step
from gradprobe.checks.optimizer.param_groups import (
    DUPLICATE_RULES,
    ZERO_LR_RULES,
    CoverageFacts,
    first_step_lr_zero_finding,
    group_lr_sources,
    refused_duplicates,
    scan_groups,
    zero_lr_explained,
)
from gradprobe.checks.optimizer.param_updates import StepObserver, _local, snapshot, stuck_findings
from gradprobe.checks.optimizer.several_optimizers import (
    held_by_others,
    shared_parameter_findings,
    wrong_step_parameters,
)
from gradprobe.checks.core.torchcompat import (
    OPTIMIZER_EMPTY,
    OPTIMIZER_NON_LEAF,
    OPTIMIZER_PARAM_IN_SEVERAL_GROUPS,
    allocation_failure,
)
from gradprobe.checks.registration.freeze_rules import GP319, measure_left_out
from gradprobe.checks.registration.shared_storage import StorageStep, facts_dict, measure_storage, storage_findings, verified_line
from gradprobe.modelset import ModelSet, idle_members
from gradprobe.findings import Finding, Rule, Situation, run_rules
from gradprobe.outcomes import resource_limit_finding, target_failed_finding
from gradprobe.report import make_report
from gradprobe.verdict import add_not_run, add_verified
from gradprobe.userframes import enclosing_def

if TYPE_CHECKING:  # loading imports the checks package: no import cycle at run time
    from gradprobe.loading import BuildRecord, Loaded

__all__ = ["StepObserver", "snapshot", "first_step_lr_zero_finding", "analyze_step", "check_coverage", "optimizer_findings",
           "optimizer_report"]

Loc = dict[str, Any]

GP201: Rule[CoverageFacts] = Rule(
    code="GP201", name="param-not-in-optimizer", severity="error", rank=33,
    summary="A trainable parameter of the model is in no param group (an error when it gets a gradient; info when the "
            "measured step gave it none).",
    why="optimizer.step() only updates the tensors it was given: the parameter gets a gradient and never changes. One "
        "deliberately kept out of training and unused by the step (a calibration temperature) loses nothing: freeze it "
        "to say so.",
    example="opt = Adam(self.parameters())  # in __init__, before a subclass adds value_head",
    message="{count} trainable parameter(s) are in no param group of {optimizer}: {names}. They get gradients but step() "
            "never updates them.",
    fix="Build the optimizer after the model is complete: opt = Adam(model.parameters())",
    situations={
        "missing": Situation(
            when="before a step is measured",
            fix="Build the optimizer after the model is complete, from model.parameters() "
                "(or add a group: optimizer.add_param_group({{'params': module.parameters()}}))."),
        "set_after": Situation(
            when="the parameters were set on the model after the optimizer was built, in the function that built it",
            message="{count} trainable parameter(s) are in no param group of {optimizer}: {names}. They get gradients but "
                    "step() never updates them. They were set on the model at line {line} of {file}, after the optimizer "
                    "was built.",
            fix="Move the assignment at line {line} of {file} before the optimizer is built, or add what it set: "
                "optimizer.add_param_group({{'params': <the new module>.parameters()}})."),
        "fed": Situation(
            when="the measured step gave them a gradient",
            message="{count} trainable parameter(s) got a gradient in this step but are in no param group of the optimizer: "
                    "{names}. step() never updates them.",
            fix="They learn nothing while they get gradients: build the optimizer from model.parameters() once the model "
                "is complete, or add them: optimizer.add_param_group({{'params': [<these parameters>]}})."),
        "fed_models": Situation(
            when="the measured step gave them a gradient, and they belong to some of several models trained together "
                 "(a script's text encoder beside its UNet, a build_model() that returned a dict of models)",
            message="{count} trainable parameter(s) of {models} got a gradient in this step but are in no param group of "
                    "the optimizer: {names}. step() never updates them.",
            fix="Give the optimizer the trainable parameters of {models} too, where it is built (a parameter group of "
                "their own: {{'params': [p for p in {first}.parameters() if p.requires_grad]}}), or add them: "
                "optimizer.add_param_group({{'params': [p for p in {first}.parameters() if p.requires_grad]}})."),
        "idle": Situation(
            when="the measured step gave them no gradient: nothing is lost in this step",
            severity="info",
            message="{count} trainable parameter(s) are in no param group and got no gradient in this step: {names}. "
                    "Nothing is lost in this step; if they are deliberately kept out of training, freeze them "
                    "(requires_grad_(False)) to say so.",
            fix="If they should learn, add them to the optimizer; if not, p.requires_grad_(False)."),
    },
)

GP202: Rule[CoverageFacts] = Rule(
    code="GP202", name="stale-optimizer-reference", severity="error", rank=11,
    summary="The optimizer holds tensors that are not the model's current parameters.",
    why="After a model is rebuilt, deep-copied, reloaded or a parameter replaced, the optimizer keeps updating the old "
        "tensors; the live model never changes.",
    example="model.encoder = copy.deepcopy(pretrained_encoder)  # after the optimizer was built",
    message="{optimizer} holds {count} tensor(s) that are not the model's current parameters; the model was rebuilt or a "
            "parameter replaced.",
    fix="Load the new weights into the existing module (module.load_state_dict(new.state_dict())) or build the optimizer "
        "after replacing modules.",
    situations={
        "replaced": Situation(
            when="the replaced parameters are named (by shape and order, or by the line that replaced them)",
            message="{optimizer} holds {count} tensor(s) that are not the model's current parameters; they were {names} "
                    "(by shape and order, or by the line that replaced them), which the model has since replaced "
                    "(rebuilt, deep-copied, reloaded or resized).",
            fix="Load the new weights into the existing module ({loads}) instead of assigning a new one, or build the "
                "optimizer after the replacement."),
        # optimizer built before fully_shard: https://github.com/pytorch/pytorch/issues/149205 (FSDP2 parameters not
        # updating; "the parameters captured by the optimizer seem to differ"), https://github.com/mosaicml/composer/pull/3822
        "sharded": Situation(
            when="the model was sharded after the optimizer was built: FSDP2's fully_shard or a tensor-parallel plan "
                 "(parallelize_module) replaced them with DTensor parameters",
            message="{optimizer} holds {count} tensor(s) that are not the model's current parameters; they were {names} "
                    "(by shape and order), which sharding (fully_shard or parallelize_module) has since replaced with "
                    "DTensor parameters: the optimizer steps tensors that get no gradient, and the model never trains.",
            fix="Build the optimizer after sharding the model (after every fully_shard(...) or parallelize_module(...) "
                "call), so that model.parameters() yields the DTensor parameters."),
        "replaced_top_level": Situation(
            when="the replaced parameters are named, and sit on the model itself (no submodule to reload)",
            message="{optimizer} holds {count} tensor(s) that are not the model's current parameters; they were {names} "
                    "(by shape and order, or by the line that replaced them), which the model has since replaced "
                    "(rebuilt, deep-copied, reloaded or resized)."),
        "during_step": Situation(
            when="the step itself replaced them (a data-dependent initialisation on the first call)",
            message="{optimizer} holds {count} tensor(s) that are not the model's current parameters; they were {names} "
                    "(by shape and order, or by the line that replaced them), which the model has since replaced "
                    "(rebuilt, deep-copied, reloaded or resized). The replacement happened during the step (e.g. a "
                    "data-dependent initialisation on the first call).",
            fix="Initialise in place so the optimizer keeps the same tensors (with torch.no_grad(): "
                "self.<param>.copy_(<value>)), or build the optimizer after the first forward."),
        "during_step_unnamed": Situation(
            when="the step itself replaced tensors that cannot be named",
            message="{optimizer} holds {count} tensor(s) that are not the model's current parameters; the model was "
                    "rebuilt or a parameter replaced. The replacement happened during the step (e.g. a data-dependent "
                    "initialisation on the first call).",
            fix="Find the module whose forward assigns a new nn.Parameter on its first call and initialise in place there "
                "(with torch.no_grad(): self.<param>.copy_(<value>)), or build the optimizer after the first forward."),
    },
)

GP203: Rule[CoverageFacts] = Rule(
    code="GP203", name="frozen-param-in-optimizer", severity="info", rank=99,
    summary="The optimizer holds parameters with requires_grad=False.",
    why="Harmless by itself (they get no gradient), but weight decay may still change them in some optimizers, and it "
        "often means the freeze happened after the optimizer was built.",
    example="opt = AdamW(model.parameters()); model.backbone.requires_grad_(False)",
    message="The optimizer holds {count} frozen parameter(s) (requires_grad=False).",
    fix="Pass only trainable parameters: AdamW(p for p in model.parameters() if p.requires_grad)",
    situations={
        "frozen_at": Situation(
            when="the line that froze them is known",
            message="The optimizer holds {count} frozen parameter(s) (requires_grad=False), frozen at line {line} of {file}."),
    },
)

GP206: Rule[CoverageFacts] = Rule(
    code="GP206", name="non-leaf-in-optimizer", severity="error", rank=12,
    summary="A non-leaf tensor handed to the optimizer.",
    why="Non-leaf tensors never receive .grad, so the optimizer cannot update them (torch refuses them).",
    example="SGD([w.cuda()], lr=0.1)  # w.cuda() is a copy with a grad_fn",
    message="The optimizer holds {count} non-leaf tensor(s); they never receive .grad.",
    fix="Optimize the leaf: w = nn.Parameter(x.cuda()); SGD([w], lr=0.1)",
    situations={
        "refused": Situation(when="torch refused to build the optimizer for it", message="make_optimizer failed: {error}"),
    },
)

GP208: Rule[CoverageFacts] = Rule(
    code="GP208", name="empty-optimizer", severity="error", rank=13,
    summary="The optimizer holds no parameters.",
    why="Nothing is updated; often a generator (model.parameters()) consumed twice, or a name filter that matched nothing.",
    example="params = model.parameters(); n = len(list(params)); Adam(params)",
    message="{optimizer} holds no parameters.",
    fix="Materialise the parameters once: params = list(model.parameters()); Adam(params)",
    situations={
        "refused": Situation(
            when="torch refused to build the optimizer for it",
            message="make_optimizer failed: the optimizer got an empty parameter list ({error})."),
    },
)

GP209: Rule[Any] = Rule(
    code="GP209", name="unsupported-optimizer", severity="warning", rank=99,
    summary="The optimizer is not a torch.optim.Optimizer (or updates outside step()), so the step check cannot observe it.",
    why="The step check watches Optimizer.step and zero_grad; coverage by identity still applies where its parameters can "
        "be read.",
    example="class MyOpt: def update(self): ...  # not a torch.optim.Optimizer",
    message="The optimizer is a {kind}, not a torch.optim.Optimizer: its coverage cannot be checked.",
    fix="Subclass torch.optim.Optimizer (or wrap the update in one) so its step can be observed.",
)

COVERAGE_RULES = (*ZERO_LR_RULES, GP208, GP202, GP201, *DUPLICATE_RULES, GP203, GP206)


def _names(names: list[str], n: int = 6) -> str:
    return f"{', '.join(names[:n])}{'...' if len(names) > n else ''}"


def _line_of(loc: Loc | None) -> dict[str, Any]:
    """The {line} and {file} template fields of a location (none when it is unknown)."""
    return {"line": loc["line"], "file": loc["file"].rsplit("/", 1)[-1]} if loc else {}


def _opt_site(loaded_record: BuildRecord | None, optimizer: Any) -> tuple[int | None, Loc | None]:
    if loaded_record is None:
        return None, None
    hit = loaded_record.optimizer_sites.get(id(optimizer))
    return hit if hit else (None, None)


def _replacement_site(record: BuildRecord | None, model: nn.Module, name: str, after_seq: int | None,
                      opt_site: Loc | None = None) -> Loc | None:
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


def _first_replacement_site(record: BuildRecord | None, model: nn.Module, names: list[str], after_seq: int | None,
                            opt_site: Loc | None) -> Loc | None:
    """The replacing line (see _replacement_site) of the first of `names` that has one."""
    return next((loc for loc in (_replacement_site(record, model, n, after_seq, opt_site) for n in names) if loc), None)


def _frozen_site(record: BuildRecord | None, tensors: list[torch.Tensor]) -> Loc | None:
    """The user line that froze most of `tensors`, if the build recorded it."""
    table = getattr(record, "frozen_sites", None) or {}
    hits = [table[id(t)][1] for t in tensors if id(t) in table]
    if not hits:
        return None
    lines = [(h["file"], h["line"]) for h in hits]
    top = max(set(lines), key=lines.count)
    return hits[lines.index(top)]


# ---- measure ----------------------------------------------------------------------------------------------------

def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "placements") and callable(getattr(t, "to_local", None))


def _pair_stale(facts: CoverageFacts, stale: list[torch.Tensor], missing: Sequence[tuple[str, torch.Tensor]],
                record: BuildRecord | None, model: nn.Module, seq: int | None) -> set[str]:
    """Pair each stale tensor with the missing parameter it most likely was: same shape, same order."""
    pool = list(missing)
    for t in stale:
        match = next((m for m in pool if tuple(m[1].shape) == tuple(t.shape)), None)
        if match is not None:
            pool.remove(match)
        facts.stale.append({"shape": list(t.shape), "likely_was": match[0] if match else None})
    replaced = [g["likely_was"] for g in facts.stale if g["likely_was"]]
    # fully_shard (FSDP2) and parallelize_module swap each parameter for a DTensor of the same (global) shape
    now = dict(missing)
    facts.sharded = bool(replaced) and all(_is_dtensor(now[n]) for n in replaced) and not any(map(_is_dtensor, stale))
    # a parameter set on its module after the optimizer was built replaced one too, whatever its shape
    # (a crop or resize that makes a new, smaller Parameter)
    if seq is not None:
        replaced += [n for n, _ in pool if n not in replaced and _replacement_site(record, model, n, seq) is not None]
    facts.replaced = replaced
    facts.replaced_at = _first_replacement_site(record, model, replaced, seq, facts.site)
    return set(replaced)


def _added_after(facts: CoverageFacts, record: BuildRecord | None, model: nn.Module, seq: int | None) -> Loc | None:
    """A module set after the optimizer was built, later in the same function (a replaced embedding): that line is the
    one to move. Set by other code (a subclass adding a head after its base built the optimizer): the optimizer's line
    is, as the optimizer was built before the model was complete."""
    site = facts.site
    if seq is None or not site:
        return None
    added_at = _first_replacement_site(record, model, [n for n, _ in facts.rest], seq, site)
    if added_at and not (added_at["file"] == site["file"]
                         and enclosing_def(site["file"], site["line"]) == enclosing_def(added_at["file"], added_at["line"])):
        return None
    return added_at


def measure_coverage(model: nn.Module, optimizer: torch.optim.Optimizer, record: BuildRecord | None = None,
                     during_step: bool = False) -> CoverageFacts:
    names = param_names(model)
    seq, site = _opt_site(record, optimizer)
    facts = CoverageFacts(kind=type(optimizer).__name__, site=site, during_step=during_step,
                          members=model.labels if isinstance(model, ModelSet) else [])
    seen: dict[int, int] = {}
    stale = scan_groups(facts, optimizer, names, seen)
    facts.total = sum(len(g["params"]) for g in optimizer.param_groups)
    trainable = [(n[0], p) for n, p in ((names[id(p)], p) for p in model.parameters()) if p.requires_grad]
    facts.trainable = len(trainable)
    others = held_by_others(optimizer, record)  # another optimizer (a GAN's other one) updates these
    missing = [(n, p) for n, p in trainable if id(p) not in seen and id(p) not in others]
    facts.missing = [n for n, _ in missing]
    explained = _pair_stale(facts, stale, missing, record, model, seq) if stale else set()
    facts.rest = [(n, p.numel()) for n, p in missing if n not in explained]
    facts.added_at = _added_after(facts, record, model, seq)
    if facts.zero_lr:
        group_lr_sources(facts, optimizer, record.group_sources if record is not None else None)
    if facts.frozen:
        # where they were frozen says more than where the optimizer was built (that line is in the evidence)
        facts.frozen_at = _frozen_site(record, [t for g in optimizer.param_groups for t in g["params"] if not t.requires_grad])
    return facts


# ---- detectors --------------------------------------------------------------------------------------------------

@GP208.detector
def detect_empty(facts: CoverageFacts) -> Iterator[Finding]:
    if facts.total == 0:
        yield GP208.finding(optimizer=facts.kind, location=facts.site, evidence={"param_groups": len(facts.groups)})


def _gp202_situation(facts: CoverageFacts, loads: list[str]) -> str | None:
    if facts.during_step:
        return "during_step" if facts.replaced else "during_step_unnamed"
    if not facts.replaced:
        return None
    if facts.sharded:
        return "sharded"
    return "replaced" if loads else "replaced_top_level"


@GP202.detector
def detect_stale(facts: CoverageFacts) -> Iterator[Finding]:
    if not facts.stale:
        return
    mods = [m for m in sorted({module_of(n) for n in facts.replaced}) if m][:3]
    loads = "; ".join(f"model.{m}.load_state_dict(new.state_dict())" for m in mods)
    rebuilt = sorted({n.split(".", 1)[0] for n in facts.replaced} & set(facts.members))
    if rebuilt:  # several models: the one rebuilt is the script's own variable
        mods, loads = rebuilt, "; ".join(f"{m}.load_state_dict(new_{m}.state_dict())" for m in rebuilt)
    evidence: dict[str, Any] = {"stale_tensors": facts.stale, "optimizer_created_at": facts.site}
    if facts.missing and not facts.rest:
        # every missing parameter is explained by GP202; keep GP201 as its consequence
        evidence["related"] = [{"code": GP201.code, "parameters": facts.missing}]
    if facts.during_step:
        evidence["replaced_during_step"] = True
    yield GP202.finding(_gp202_situation(facts, mods), optimizer=facts.kind, count=len(facts.stale),
                        names=_names(facts.replaced), loads=loads, parameters=facts.replaced,
                        location=facts.replaced_at or facts.site, evidence=evidence)


@GP201.detector
def detect_missing(facts: CoverageFacts) -> Iterator[Finding]:
    if not facts.rest:
        return
    by_module: dict[str, int] = {}
    for n, numel in facts.rest:
        by_module[module_of(n)] = by_module.get(module_of(n), 0) + numel
    rest = [n for n, _ in facts.rest]
    yield GP201.finding(
        "set_after" if facts.added_at else "missing", count=len(rest), optimizer=facts.kind, names=_names(rest),
        **_line_of(facts.added_at), parameters=rest, location=facts.added_at or facts.site,
        evidence={"missing": len(rest), "missing_numel_by_module": by_module, "optimizer_created_at": facts.site,
                  "set_after_optimizer_at": facts.added_at, "optimizer_tensors": facts.total,
                  "model_trainable": facts.trainable})


@GP203.detector
def detect_frozen(facts: CoverageFacts) -> Iterator[Finding]:
    if facts.frozen:
        yield GP203.finding("frozen_at" if facts.frozen_at else None, count=len(facts.frozen), **_line_of(facts.frozen_at),
                            parameters=facts.frozen, location=facts.frozen_at or facts.site,
                            evidence={"frozen": len(facts.frozen), "optimizer_created_at": facts.site})


@GP206.detector
def detect_nonleaf(facts: CoverageFacts) -> Iterator[Finding]:
    if facts.nonleaf:
        yield GP206.finding(count=len(facts.nonleaf), parameters=facts.nonleaf, location=facts.site,
                            evidence={"non_leaf": facts.nonleaf})


@GP209.detector
def detect_unsupported(optimizer: Any) -> Iterator[Finding]:
    if not isinstance(optimizer, torch.optim.Optimizer):
        kind = type(optimizer)
        yield GP209.finding(kind=kind.__name__, evidence={"type": f"{kind.__module__}.{kind.__name__}"})


# ---- the engine -------------------------------------------------------------------------------------------------

def check_coverage(model: nn.Module, optimizer: Any, record: BuildRecord | None = None) -> tuple[list[Finding], list[dict]]:
    """Identity comparison of optimizer groups with the model's parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return run_rules((GP209,), optimizer), []
    facts = measure_coverage(model, optimizer, record)
    left_out = run_rules((GP319,), measure_left_out(model, facts.missing, facts.site))  # a filter that matched too much
    return run_rules(COVERAGE_RULES, facts) + left_out + shared_parameter_findings(model, optimizer, record), facts.groups


def replaced_during_step(model: nn.Module, optimizer: Any, record: BuildRecord | None, seen: set[tuple]) -> list[Finding]:
    """GP202 for parameters the step itself replaced (a data-dependent init swapping in new nn.Parameter objects
    on the first call, after the optimizer was built); `seen` holds (code, parameters) already reported."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return []
    facts = measure_coverage(model, optimizer, record, during_step=True)
    return [f for f in run_rules((GP202,), facts) if (f["code"], tuple(f["parameters"])) not in seen]


def _settled(f: Finding, names: list[str], got: bool, models: list[str] | None = None) -> Finding:
    situation = ("fed_models" if models else "fed") if got else "idle"
    return GP201.finding(situation, count=len(names), names=_names(names), parameters=names,
                         models=" and ".join(models or []), first=(models or [""])[0],
                         location=f["location"], evidence={**f["evidence"], "missing": len(names), "got_gradient": got})


def settle_coverage(coverage: list[Finding], model: nn.Module, got_grad: set[int]) -> list[Finding]:
    """After a measured step, GP201 stays an error only for the parameters that got a gradient there.

    A trainable parameter outside the optimizer that the step gave no gradient (a calibration temperature
    fitted after training, a head used only in eval) loses nothing in this step: it is said as info.
    """
    by_name = {ns[0]: pid for pid, ns in param_names(model).items()}
    out: list[Finding] = []
    for f in coverage:
        if f["code"] != GP201.code:
            out.append(f)
            continue
        frozen = idle_members(model, set(f["parameters"]), got_grad)  # several models: a teacher beside the trained ones
        fed = [n for n in f["parameters"] if by_name.get(n) in got_grad]
        idle = [n for n in f["parameters"] if by_name.get(n) not in got_grad and n.split(".", 1)[0] not in frozen]
        models = sorted({n.split(".", 1)[0] for n in fed}) if isinstance(model, ModelSet) else None
        out += [_settled(f, fed, True, models)] if fed else []
        out += [_settled(f, idle, False)] if idle else []
    return out


def analyze_step(model: nn.Module, optimizer: Any, before: dict[int, torch.Tensor], obs: StepObserver,
                 coverage: list[Finding], opt_site: Loc | None = None) -> list[Finding]:
    """Parameters with a nonzero gradient after backward that one real step left unchanged, and why
    (those GP201 and GP202 already explain are left out)."""
    already = {n for f in coverage if f["code"] in (GP201.code, GP202.code) for n in f["parameters"]}
    wrong = obs.owners.findings() if obs.owners is not None else []  # a step() on the other optimizer (GP211)
    warmup, zero_lr_at = zero_lr_explained(coverage)
    already |= warmup | wrong_step_parameters(wrong)
    return wrong + stuck_findings(model, optimizer, before, obs, already, opt_site, zero_lr_at or opt_site)


def check_step(loaded: Loaded, coverage: list[Finding], observers: Sequence[Any] = ()) -> tuple[list[Finding], dict[str, Any]]:
    """Run one real step and report parameters with a nonzero gradient that did not change."""
    from gradprobe.loading import BuildRecorder

    before = snapshot(loaded.model)
    with StepObserver(loaded.model, loaded.optimizer, loaded.user, loaded.record) as obs, \
            BuildRecorder(loaded.user, loaded.record, writes=False):
        result = run_step(loaded, optimizer_step=True, observers=observers)
    coverage += replaced_during_step(loaded.model, loaded.optimizer, loaded.record,
                                     {(f["code"], tuple(f["parameters"])) for f in coverage})
    err = result.error
    facts: dict[str, Any] = {"events": obs.events[:50],
             "step_error": f"{type(err).__name__}: {err}" if err is not None else result.loss_problem}
    if result.resource_limit is not None:  # a memory limit stopped the step: nothing about updates is measured
        return [resource_limit_finding("running one real step (forward, backward, optimizer.step)", result.resource_limit,
                                       location=result.error_location, evidence={"traceback": result.error_traceback})], facts
    if result.failed:
        return [], facts
    coverage[:] = settle_coverage(coverage, loaded.model, set(obs.grad_after_backward))
    facts["moved"] = moved_count(loaded.model, before)
    return analyze_step(loaded.model, loaded.optimizer, before, obs, coverage,
                        _opt_site(loaded.record, loaded.optimizer)[1]), facts


def check_optimizer_coverage(model: nn.Module, optimizer: Any, batch: Any = None, loss_fn: Any = None,
                             train_step: Any = None, step: bool = True, project_dir: str | None = None) -> dict[str, Any]:
    """Library entry: coverage by identity, plus one real step when a batch or train_step is given."""
    from gradprobe.loading import live_target

    loaded = live_target(model, batch, loss_fn, optimizer, train_step, project_dir)
    return optimizer_report(loaded, step=step and (batch is not None or train_step is not None))


def build_failure_findings(loaded: Loaded) -> list[Finding]:
    """make_optimizer raised: torch's refusals are the GP2xx they name; a memory limit stopped it; else the user's code raised."""
    exc = loaded.optimizer_error
    assert exc is not None
    text = str(exc.cause or exc)
    loc = loaded.user.innermost_of_traceback(exc.cause) if exc.cause is not None else None
    if OPTIMIZER_PARAM_IN_SEVERAL_GROUPS in text:
        return [refused_duplicates(text, loaded.record.group_sources, param_names(loaded.model), loc, loaded.user)]
    for marker, rule in ((OPTIMIZER_EMPTY, GP208), (OPTIMIZER_NON_LEAF, GP206)):
        if marker in text:
            return [rule.finding("refused", error=text, location=loc, evidence={"error": text})]
    limit = allocation_failure(exc.cause)
    if limit is not None and exc.cause is not None:
        return [resource_limit_finding("making the optimizer", limit, location=loc,
                                       evidence={"traceback": loaded.user.trimmed_traceback(exc.cause)})]
    return [target_failed_finding("making the optimizer", text, situation="optimizer", location=loc,
                                  evidence={"traceback": loaded.user.trimmed_traceback(exc.cause) if exc.cause else text})]


def moved_count(model: nn.Module, before: dict[int, torch.Tensor]) -> tuple[int, int]:
    """(parameters the step changed, parameters measured) of a snapshot taken before it."""
    params = [p for p in model.parameters() if id(p) in before and before[id(p)].shape == p.shape]
    return sum(not torch.equal(before[id(p)], _local(p.detach())) for p in params), len(params)


def coverage_line(model: nn.Module, optimizer: Any) -> str:
    """What the coverage check measured (facts.verified): which trainable parameters the optimizer holds, by identity."""
    held = {id(p) for g in getattr(optimizer, "param_groups", []) for p in g.get("params", [])}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    groups = len(getattr(optimizer, "param_groups", []))
    return (f"optimizer coverage: {type(optimizer).__name__} ({groups} group(s)) holds {len(trainable & held)} of "
            f"{len(trainable)} trainable parameter(s), compared by identity")


def _step_verdict(facts: dict[str, Any], step_facts: dict[str, Any]) -> None:
    moved = step_facts.get("moved")
    if moved is not None:
        add_verified(facts, f"one real optimizer step: {moved[0]} of {moved[1]} trainable parameter(s) changed")
    elif step_facts.get("step_error"):
        add_not_run(facts, "the optimizer step check", f"the step failed: {step_facts['step_error']}", "user_code")


def optimizer_findings(loaded: Loaded, step: bool = True, storage: bool = True) -> tuple[list[Finding], dict[str, Any]]:
    """`storage`: also distinct Parameters over one storage (GP805) and, with the step, the update it causes (diagnose
    measures those in its own step)."""
    if loaded.optimizer_error is not None:
        return build_failure_findings(loaded), {}
    if loaded.optimizer is None:
        none: dict[str, Any] = {"note": "the target has no optimizer: only registration-level facts apply"}
        add_not_run(none, "optimizer coverage", "the target gives no optimizer (`optimizer`, or make_optimizer in the "
                    "model's file)", "not_applicable")
        return [], none
    findings, groups = check_coverage(loaded.model, loaded.optimizer, loaded.record)
    facts: dict[str, Any] = {"optimizer": type(loaded.optimizer).__name__, "param_groups": groups}
    shared = measure_storage(loaded.model, loaded.optimizer, loaded.record) if storage else None
    add_verified(facts, coverage_line(loaded.model, loaded.optimizer))
    has_step = loaded.batch is not None or loaded.train_step is not None
    if step and isinstance(loaded.optimizer, torch.optim.Optimizer) and has_step:
        watch = (StorageStep(shared, loaded.optimizer),) if shared is not None else ()
        more, step_facts = check_step(loaded, findings, watch)
        findings += more
        facts["step"] = step_facts
        _step_verdict(facts, step_facts)
    elif step and isinstance(loaded.optimizer, torch.optim.Optimizer):
        add_not_run(facts, "the optimizer step check", "the target gives no inputs and no train_step to run a step with",
                    "not_applicable")
    if shared is not None:
        findings += storage_findings(shared)
        facts["shared_storage"] = facts_dict(shared)
        add_verified(facts, verified_line(shared))
    return findings, facts


def optimizer_report(loaded: Loaded, step: bool = True) -> dict[str, Any]:
    findings, facts = optimizer_findings(loaded, step)
    summary = []
    if "note" in facts:
        summary.append("No optimizer in the target: give `optimizer` (a callable taking the model) or define make_optimizer.")
    elif "param_groups" in facts:
        groups = facts["param_groups"]
        summary.append(f"{facts['optimizer']} with {len(groups)} group(s): " + "; ".join(
            f"lr={g['lr']} wd={g['weight_decay']} tensors={g['tensors']}" for g in groups))
    return make_report("check_optimizer_coverage", findings, summary, **facts)
