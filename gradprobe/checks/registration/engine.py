"""GP1xx: is every tensor that should learn registered, a leaf, and trainable?

Three stages: measure the model (checks/registration/module_walk.py walks every module's `__dict__` for what
`named_parameters()` cannot see), run the rules over each attribute, each module and the whole model,
then merge the findings one per user line. Plain tensors and learnable buffers, which the measured step finds too,
are checks/registration/unregistered.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.registration.module_walk import AttrFacts, ModelFacts, ModuleFacts, measure_model, one_per_line
from gradprobe.checks.registration.unregistered import (
    PER_ATTRIBUTE,
    PLAIN_TENSOR_RULES,
    BUFFER_RULES,
    buffer_use_findings,
    float_buffers,
    plain_tensor_attributes,
    plain_tensor_findings,
    settle_buffers,
)
from gradprobe.checks.registration.freeze_rules import GP319, measure_freezes
from gradprobe.checks.registration.shared_storage import facts_dict, measure_storage, storage_findings, verified_line
from gradprobe.checks.registration.trainable_set import compact, summary_lines, trainable_set
from gradprobe.findings import Finding, Rule, Situation, run_rules
from gradprobe.report import make_report
from gradprobe.userframes import UserCode

if TYPE_CHECKING:  # loading imports the checks package: no import cycle at run time
    from gradprobe.loading import BuildRecord, Loaded

__all__ = ["check_registration", "inspect_parameters", "inspect_report", "parameter_table", "plain_tensor_attributes",
           "float_buffers", "plain_tensor_findings", "buffer_use_findings", "settle_buffers"]

GP102: Rule[AttrFacts] = Rule(
    code="GP102", name="parameter-in-plain-container", severity="error", rank=6,
    summary="nn.Parameters held in a Python list, tuple or dict attribute.",
    why="nn.Module registers only attributes that are Parameters or Modules themselves; a list of Parameters is invisible "
        "to parameters() and the optimizer.",
    example="self.weights = [nn.Parameter(torch.ones(1)) for _ in range(3)]",
    message="`{path}` is a Python {kind} holding {count} nn.Parameter(s) that {owner} does not register: the optimizer "
            "never updates them.",
    fix="Use nn.ParameterList (or nn.ParameterDict): self.weights = nn.ParameterList(nn.Parameter(torch.ones(1)) for _ "
        "in range(3))",
    situations={
        "container": Situation(when="always: the fix names the user's attribute and container",
                               fix="self.{attr} = {replacement}({value})  # instead of a plain {kind}"),
    },
)

GP103: Rule[AttrFacts] = Rule(
    code="GP103", name="module-in-plain-container", severity="error", rank=7,
    summary="nn.Modules held in a Python list, tuple or dict attribute.",
    why="Submodules in a plain container are not registered: their parameters are missing from parameters(), the "
        "optimizer and state_dict(), and .to()/.train() do not reach them.",
    example="self.blocks = [Block(d) for _ in range(4)]",
    message="`{path}` is a Python {kind} holding {count} module(s) ({classes}) whose {n_params} parameters are not "
            "registered.",
    fix="Use nn.ModuleList (or nn.ModuleDict): self.blocks = nn.ModuleList(Block(d) for _ in range(4))",
    situations={
        "container": Situation(when="always: the fix names the user's attribute and container",
                               fix="self.{attr} = {replacement}({value})  # instead of a plain {kind}"),
    },
)

GP105: Rule[ModelFacts] = Rule(
    code="GP105", name="frozen-parameters", severity="info", rank=99,
    summary="Parameters with requires_grad=False.",
    why="Frozen parameters get no gradient; fine when meant (a frozen backbone), a bug when not.",
    example="model.backbone.requires_grad_(False)",
    message="{frozen} of {total} parameters are frozen (requires_grad=False){by_module}.",
    fix="If they should learn: module.requires_grad_(True), and rebuild the optimizer.",
)

GP107: Rule[AttrFacts] = Rule(
    code="GP107", name="requires-grad-attribute", severity="error", rank=8,
    summary="module.requires_grad = ... set as a plain attribute.",
    why="nn.Module has no requires_grad property: the assignment creates an unrelated attribute and the parameters keep "
        "their flag.",
    example="block.requires_grad = True",
    message="`{path} = {value}` sets a plain attribute on {owner}; its {count} parameters keep requires_grad={flags}.",
    fix="Call the method: block.requires_grad_(True)",
    situations={
        "attribute": Situation(when="always: the fix names the user's module",
                               fix="{module}.requires_grad_({value})  # the method, not an attribute"),
    },
)

GP108: Rule[ModelFacts] = Rule(
    code="GP108", name="tied-parameters", severity="info", rank=99,
    summary="One Parameter reachable under several names (weight tying).",
    why="Tied weights are trained once and get the sum of both gradients; freezing one name freezes both.",
    example="self.decoder.weight = self.encoder.weight",
    message="One Parameter is reachable as {names} (tied): trained once, with both gradients summed.",
    fix="Nothing to fix if the tie is meant.",
    situations={
        "frozen": Situation(
            when="the tied Parameter is frozen",
            message="One Parameter is reachable as {names} (tied): frozen (requires_grad=False) under every name; "
                    "unfreezing one name unfreezes all."),
    },
)

GP109: Rule[AttrFacts] = Rule(
    code="GP109", name="non-leaf-parameter", severity="error", rank=9,
    summary="A tensor meant to be learned is not a leaf.",
    why="nn.Parameter(x).to(...) / .cuda() / .half() return a new non-leaf tensor: it is not registered, and its .grad "
        "stays None; the real leaf is lost.",
    example="self.w = nn.Parameter(torch.zeros(3)).to(torch.float64)",
    message="`{path}` is a non-leaf tensor (made by {op}) stored on {owner}: it is not registered and its .grad stays "
            "None; the leaf Parameter it came from is lost.",
    fix="Convert first, wrap last: self.w = nn.Parameter(torch.zeros(3, dtype=torch.float64))",
    situations={
        "attribute": Situation(
            when="always: the fix names the user's attribute",
            fix="Create the tensor with the final dtype/device, then wrap it: self.{attr} = nn.Parameter(torch.full(..., "
                "dtype=..., device=...))"),
    },
)

GP110: Rule[ModelFacts] = Rule(
    code="GP110", name="no-trainable-parameters", severity="error", rank=3,
    summary="The model has no parameter with requires_grad=True.",
    why="Nothing can learn; backward raises 'element 0 of tensors does not require grad'.",
    example="model.requires_grad_(False) before building the optimizer",
    message="None of the model's {count} parameters requires grad: nothing can learn.",
    fix="Unfreeze what should learn: module.requires_grad_(True)",
    situations={
        "frozen_at": Situation(
            when="the line that froze them is known",
            message="None of the model's {count} parameters requires grad: nothing can learn (frozen at line {line} of "
                    "{file})."),
        "empty": Situation(when="the model has no parameters at all (and no unregistered tensor explains it)",
                           message="The model has no parameters at all."),
    },
)

GP111: Rule[ModuleFacts] = Rule(
    code="GP111", name="grad-mode-disabled", severity="error", rank=4,
    summary="Gradient recording is off when the forward runs.",
    why="Under no_grad / inference_mode no graph is recorded, so nothing reaches the parameters.",
    example="torch.set_grad_enabled(False) at import, or @torch.no_grad() on forward",
    message="{owner}.forward is decorated with {kind}: its {count} parameters never get a gradient.",
    fix="Remove the global switch or the decorator from the training path; keep no_grad for evaluation only.",
    situations={
        "library": Situation(
            when="the decorated forward is library code, decorated by design",
            severity="warning",
            message="{owner}.forward is decorated with {kind}: its {count} parameters never get a gradient through it. "
                    "It is library code, decorated by design (e.g. an index computation).",
            fix="Nothing to fix if the library means it; train these parameters with the objective the library provides "
                "for them."),
        "global_at": Situation(
            when="gradient recording is globally off after the build, switched off at a known user line",
            message="Gradient recording is globally off after importing and building the target "
                    "(torch.set_grad_enabled(False) at line {line} of {file})."),
        "global": Situation(
            when="gradient recording is globally off after the build, switched off where no user line was recorded",
            message="Gradient recording is globally off after importing and building the target "
                    "(torch.set_grad_enabled(False) or a no_grad context left open)."),
    },
)

ATTRIBUTE_RULES = (GP102, GP103, *PLAIN_TENSOR_RULES, GP109, GP107)
MODULE_RULES = (*BUFFER_RULES, GP111)
MODEL_RULES = (GP110, GP105, GP108)
_PER_ATTRIBUTE = PER_ATTRIBUTE | {GP102.code, GP103.code, GP109.code}


def _line_of(loc: dict[str, Any] | None) -> dict[str, Any]:
    return {"line": loc["line"], "file": loc["file"].rsplit("/", 1)[-1]} if loc else {}


# ---- detectors, per attribute --------------------------------------------------------------------------------------

@GP102.detector
def detect_parameters_in_container(a: AttrFacts) -> Iterator[Finding]:
    if a.stray_params:
        yield GP102.finding("container", path=a.path, kind=a.container, count=len(a.stray_params), owner=a.owner_class,
                            attr=a.attr, replacement="nn.ParameterDict" if a.container == "dict" else "nn.ParameterList",
                            value=a.rhs or "...", parameters=a.stray_params, location=a.site,
                            evidence={"attribute": a.path, "container": a.container, "count": len(a.stray_params)})


@GP103.detector
def detect_modules_in_container(a: AttrFacts) -> Iterator[Finding]:
    if a.stray_modules:
        names = [n for _, _, ps in a.stray_modules for n in ps]
        yield GP103.finding("container", path=a.path, kind=a.container, count=len(a.stray_modules),
                            classes=", ".join(sorted({t for _, t, _ in a.stray_modules})), n_params=len(names), attr=a.attr,
                            replacement="nn.ModuleDict" if a.container == "dict" else "nn.ModuleList", value=a.rhs or "...",
                            parameters=names, location=a.site,
                            evidence={"attribute": a.path, "container": a.container,
                                      "modules": [m for m, _, _ in a.stray_modules], "unregistered_parameters": len(names)})


@GP109.detector
def detect_non_leaf(a: AttrFacts) -> Iterator[Finding]:
    value = a.value
    if isinstance(value, torch.Tensor) and not value.is_leaf:
        op = type(value.grad_fn).__name__ if value.grad_fn is not None else None
        yield GP109.finding("attribute", path=a.path, op=op, owner=a.owner_class, attr=a.attr, parameters=[a.path],
                            location=a.site, evidence={"attribute": a.path, "grad_fn": op, "shape": list(value.shape),
                                                       "dtype": str(value.dtype)})


@GP107.detector
def detect_requires_grad_attribute(a: AttrFacts) -> Iterator[Finding]:
    if a.attr != "requires_grad" or not isinstance(a.value, bool):
        return
    names = [a.prefix + n for n, _ in a.owner.named_parameters()]
    flags = sorted({p.requires_grad for p in a.owner.parameters()})
    yield GP107.finding("attribute", path=a.path, value=a.value, owner=a.owner_class, count=len(names),
                        flags=flags[0] if len(flags) == 1 else flags, module=a.mod_name.rpartition(".")[2] or "module",
                        parameters=names, location=a.site,
                        evidence={"module": a.mod_name or "(root)", "attribute_value": a.value,
                                  "parameter_requires_grad": flags})


# ---- detectors, per module and on the whole model --------------------------------------------------------------------

@GP111.detector
def detect_decorated_forward(m: ModuleFacts) -> Iterator[Finding]:
    d = m.decorated
    if d is not None:
        yield GP111.finding("library" if d.library else None, owner=type(m.owner).__name__, kind=d.kind, count=len(d.names),
                            parameters=d.names, location=d.location,
                            evidence={"module": m.mod_name or "(root)", "decorator": d.kind, "library_code": d.library})


def _grad_off_globally(facts: ModelFacts) -> list[Finding]:
    if not facts.grad_off:
        return []
    at = facts.grad_off_sites[-1][1] if facts.grad_off_sites else None
    return [GP111.finding("global_at" if at else "global", **_line_of(at),
                          parameters=[n for n, p in facts.params if p.requires_grad], location=at,
                          evidence={"torch.is_grad_enabled()": False})]


@GP110.detector
def detect_nothing_trainable(facts: ModelFacts) -> Iterator[Finding]:
    params = facts.params
    if params and len(facts.frozen) == len(params):
        yield GP110.finding("frozen_at" if facts.freeze_at else None, count=len(params), **_line_of(facts.freeze_at),
                            parameters=facts.frozen[:50], location=facts.freeze_at,
                            evidence={"parameters": len(params), "frozen": len(facts.frozen)})
    if not params and not facts.unregistered:
        yield GP110.finding("empty", evidence={"parameters": 0})


@GP105.detector
def detect_frozen(facts: ModelFacts) -> Iterator[Finding]:
    params = facts.params
    if facts.frozen and len(facts.frozen) != len(params):
        yield GP105.finding(frozen=len(facts.frozen), total=len(params), parameters=facts.frozen, location=facts.freeze_at,
                            by_module=f"; by module: {facts.by_module}" if facts.by_module else "",
                            evidence={"frozen": len(facts.frozen), "total": len(params),
                                      "frozen_numel": sum(p.numel() for n, p in params if not p.requires_grad)})


@GP108.detector
def detect_tied(facts: ModelFacts) -> Iterator[Finding]:
    for names, trains in zip(facts.aliases, facts.alias_trains, strict=True):
        yield GP108.finding(None if trains else "frozen", names=", ".join(names), parameters=names,
                            evidence={"names": names})


# ---- the engine ----------------------------------------------------------------------------------------------------

def check_registration(model: nn.Module, build_record: BuildRecord | None = None, info: dict[str, Any] | None = None,
                       user: UserCode | None = None) -> list[Finding]:
    """All GP1xx findings (but those that arise while loading) on a live model."""
    facts = measure_model(model, build_record, info, user)
    if facts.frozen and len(facts.frozen) != len(facts.params):
        facts.by_module = compact(trainable_set(model, build_record))
    findings: list[Finding] = []
    for m in facts.modules:
        for a in m.attributes:
            findings += run_rules(ATTRIBUTE_RULES, a)
        findings += run_rules(MODULE_RULES, m)
    findings += _grad_off_globally(facts)
    findings += run_rules(MODEL_RULES, facts)
    findings += run_rules((GP319,), measure_freezes(model, build_record))  # a freezing rule that matched too much
    return one_per_line(findings, _PER_ATTRIBUTE)


def parameter_table(model: nn.Module) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    rows = []
    for name, p in model.named_parameters():
        rows.append({
            "name": name, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
            "device": str(p.device), "requires_grad": p.requires_grad, "is_leaf": p.is_leaf,
            "numel": p.numel(), "tied_aliases": [a for a in aliases[id(p)] if a != name],
        })
    buffers = [
        {"name": n, "shape": list(b.shape), "dtype": str(b.dtype).replace("torch.", ""),
         "device": str(b.device), "requires_grad": b.requires_grad}
        for n, b in model.named_buffers()
    ]
    return rows, buffers


def inspect_parameters(model: nn.Module, build_record: BuildRecord | None = None,
                       info: dict[str, Any] | None = None, optimizer: Any = None) -> dict[str, Any]:
    """The registration report: findings GP101-GP111 plus the parameter and buffer tables, and distinct Parameters over
    one storage (GP805, without a step: the update it causes is measured by check_optimizer_coverage and diagnose)."""
    findings = check_registration(model, build_record, info)
    shared = measure_storage(model, optimizer, build_record)
    findings += storage_findings(shared)
    rows, buffers = parameter_table(model)
    trainable = {id(p): p for p in model.parameters() if p.requires_grad}
    total = {id(p): p for p in model.parameters()}
    summary = [
        f"{len(rows)} parameters ({sum(p.numel() for p in total.values()):,} values), "
        f"{len(trainable)} trainable ({sum(p.numel() for p in trainable.values()):,} values), {len(buffers)} buffers."
    ]
    tset = trainable_set(model, build_record)
    summary += summary_lines(tset)
    verified = [registration_line(model), verified_line(shared)]
    return make_report(
        "inspect_parameters", findings, summary, verified=verified,
        parameters=rows, buffers=buffers, trainable_set=tset,
        counts={"parameters": len(rows), "trainable": len(trainable),
                "numel": sum(p.numel() for p in total.values()),
                "trainable_numel": sum(p.numel() for p in trainable.values())},
        shared_storage=facts_dict(shared),
    )


def registration_line(model: nn.Module) -> str:
    """What the registration checks measured, as a verdict's line (facts.verified)."""
    params = {id(p): p for p in model.parameters()}
    trainable = sum(p.requires_grad for p in params.values())
    modules = sum(1 for _ in model.modules())
    return (f"registration: {modules} module(s), {len(params)} parameter(s) ({trainable} trainable) and "
            f"{sum(1 for _ in model.buffers())} buffer(s) inspected")


def inspect_report(loaded: Loaded) -> dict[str, Any]:
    """The inspect_parameters tool on a loaded target."""
    return inspect_parameters(loaded.model, loaded.record, loaded.info, loaded.optimizer)
