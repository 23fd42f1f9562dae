"""GP318: the op where an exactly-zero gradient became zero, the zero operand, the line that made it, and whether it
stays zero (a mask that selects nothing) or is a weight ramping up from 0 (information, not a warning); an activation
whose every input was in its dead region (with the bias that put them there and the line that set it), and an index op
that selected nothing (with the count and the line that made the index).

Written from public threads: a loss multiplied by a mask that is zero everywhere leaves the head it trains with a zero
gradient (open-mmlab/mmpretrain pull #1426: a task whose samples are all masked out gave the loss 0 and no gradient;
mila-iqia/blocks issue #952: `(cost * y_mask).sum()`), and a loss weight warmed up from 0 is a common, healthy
schedule (layumi/Person_reID_baseline_pytorch issue #338: "loss warm-up" instead of an lr warm-up); a bias initialised
to a large negative value kills every ReLU unit (facebookresearch/dlrm pull #358); a batch whose labels are all the
ignore index selects nothing (allenai/OLMo-core pull #657, pytorch/pytorch issue #70348).
The facts are measured during the traced step (zero_ops.py) and read back from the source (zero_expr.py), beside this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.nn as nn

from gradprobe.checks.trace.gradient_facts import TraceFacts
from gradprobe.checks.core.rule_text import listed
from gradprobe.checks.trace.zero_expr import ZeroSource, set_at
from gradprobe.checks.trace.zero_ops import ZeroOp
from gradprobe.findings import Finding, Rule, Situation

Loc = dict[str, Any]
OP_TEXT = {"__getitem__": "x[index]"}
KIND_SITUATION = {"random": "random_draw", "dead": "dead_relu", "index": "empty_index"}

GP318: Rule[TraceFacts] = Rule(
    code="GP318", name="zeroed-by-op", severity="warning", rank=35,
    summary="An exactly-zero gradient, traced to the op that zeroed it: a multiply by an all-zero mask or weight, a "
            "`where` whose condition selects nothing, an activation dead on every input, an index that selects nothing "
            "(info for a loss weight ramping up from 0).",
    why="The gradient reaches that op nonzero and leaves it zero: the parameters behind it learn nothing from this "
        "batch; a mask that selects only padding does so at every step, a weight that starts at 0 only until it rises.",
    example="tok_loss = (tok_loss * (1 - mask)).sum()  # mask = (tags == PAD): every position is padding",
    message="{count} parameter(s) ({names}) got an exactly-zero gradient: `{op}` at line {line} of {file} multiplies "
            "their path by an operand that is zero everywhere (shape {shape}).",
    fix="Find what makes the zero operand of the op at line {line} of {file}: a mask that selects nothing or a weight "
        "of 0; these parameters learn nothing while it stays zero.",
    situations={
        "mask": Situation(
            when="the zero operand is a tensor (a mask) whose expression was read back from the line",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient: line {line} of {file} multiplies "
                    "their path by `{expr}`, which is zero everywhere (shape {shape}){made}.",
            fix="The mask `{expr}` keeps none of the positions that reach these parameters: fix what builds it{made_at} "
                "(an inverted comparison, a padding id that matches every position, labels that are all ignored); if "
                "a batch can have no valid position, skip the term for it instead of multiplying it by zeros."),
        "where": Situation(
            when="a torch.where's condition leaves the branch that carries the parameters no position",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient: torch.where at line {line} of {file} "
                    "takes no position from the branch that carries them; its condition `{expr}` selects nothing "
                    "(shape {shape}){made}.",
            fix="Check the condition `{expr}`{made_at}: it is the same everywhere, so the branch that carries these "
                "parameters is never taken (an inverted or always-false comparison)."),
        "scale_ramp": Situation(
            when="a scalar weight of 0 that becomes positive when a number it is computed from (a step counter) grows",
            severity="info",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient at this step: line {line} of {file} "
                    "weights their loss term by `{expr}`, which is 0 now and {later} as `{number}` grows: a weight "
                    "ramping up from 0; they get gradients at later steps.",
            fix="Nothing to fix if the ramp from 0 is intended; to train these parameters from the first step, start "
                "the weight above 0."),
        "scale_stays": Situation(
            when="a scalar weight of 0 that stays 0 when every number it is computed from grows",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient: line {line} of {file} weights their "
                    "loss term by `{expr}`, which is 0 and stays 0 when the numbers it is computed from grow "
                    "({inputs}){made}: they never learn from it.",
            fix="Make `{expr}` (line {line} of {file}) positive at the steps that should train these parameters (its "
                "schedule reaches no value above 0); if the term is off on purpose, freeze or remove what only it trains."),
        "scale_constant": Situation(
            when="a scalar weight of 0 computed from no number that changes with the step (a constant or a config value)",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient: line {line} of {file} weights their "
                    "loss term by `{expr}`, which is 0 and is computed from no number that changes with the step{made}: "
                    "the weight switches the term off.",
            fix="Set `{expr}` (line {line} of {file}) to a positive value if this term should train these parameters; "
                "if it is off on purpose, freeze or remove what only it trains (a callback that raises it later makes "
                "it a ramp: nothing to fix)."),
        "random_draw": Situation(
            when="the all-zero mask was computed from a random draw (dropout, stochastic depth / drop path)",
            severity="info",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient at this step: line {line} of {file} "
                    "multiplies their path by a mask computed from a random draw that dropped every position of this "
                    "batch (shape {shape}): dropout or stochastic depth by design; other draws keep them.",
            fix="Nothing to fix if the drop is intended (dropout, drop path); if these parameters never get a "
                "gradient over several steps (`audit_training`), check the drop rate."),
        "dead_relu": Situation(
            when="an activation (relu, clamp, hardtanh, threshold) had every input of the batch in the region where its "
                 "derivative is 0",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient: `{op}` {where} had "
                    "{dead} of its {total} inputs in its dead region ({region}{span}), so it passed no gradient back"
                    "{cause}{readers}.",
            fix="Every unit of `{op}` {where} is dead on this batch, not just a few: {remedy}."),
        "dead_hinge": Situation(
            when="the dead activation's output is summed or averaged straight into the loss (a hinge or margin loss) "
                 "and every one of its terms is 0 on this batch",
            severity="info",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient at this step: `{op}` {where} is a "
                    "term of the loss (the same gradient reached all of it) and had {dead} of its {total} inputs in "
                    "its dead region ({region}{span}): every margin is met on this batch, so the loss is 0 and trains "
                    "nothing from it.",
            fix="Nothing to fix if the margin loss is meant to be 0 once every margin is met; if it is met from the "
                "first step on, the margin is too small or the pairs too easy (mine harder negatives)."),
        "empty_index": Situation(
            when="an index op (`x[mask]`, index_select, gather, masked_select) selected nothing from the path",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient: `{op}` {where} "
                    "selected nothing from their path: its index `{expr}` selects 0 of {selectable}{made}.",
            fix="The index `{expr}`{made_at} selects no position of this batch (labels that are all ignored, a mask "
                "that matches nothing): fix what builds it; if a batch can have no valid position, skip the term for "
                "it (`if mask.any()`) rather than selecting an empty set (a mean over it is NaN)."),
    },
)


def zeroed(facts: TraceFacts) -> list[tuple[ZeroOp, list[nn.Parameter]]]:
    """The zeroing ops and, for each, the wanted zero-gradient parameters (that no cut explains) it zeroed."""
    if facts.limited:
        return []
    zero = [p for p in facts.zero if id(p) not in facts.attributed and facts.wanted(facts.name(p))]
    return facts.tracer.zero_ops.zeroed(zero) if zero else []


def zeroed_ids(facts: TraceFacts) -> set[int]:
    return {id(p) for _, ps in zeroed(facts) for p in ps}


def _situation(rec: ZeroOp, src: ZeroSource) -> str | None:
    if rec.dead is not None and rec.dead.summed:
        return "dead_hinge"
    if rec.kind in KIND_SITUATION:
        return KIND_SITUATION[rec.kind]
    if src.expr is None:
        return None
    if rec.kind != "scale":
        return rec.kind
    if src.rises is not None:
        return "scale_ramp"
    return "scale_stays" if src.inputs else "scale_constant"


def _later(src: ZeroSource) -> str:
    if src.rises is None:
        return ""
    return ", ".join(f"{v:g} at +{k}" for k, v in src.rises[1][:3])


def _dead_fields(facts: TraceFacts, rec: ZeroOp, params: list[nn.Parameter]) -> tuple[dict[str, Any], Loc | None]:
    """A dead activation's measured facts as message fields, and the line that made its inputs dead (if read)."""
    dead = rec.dead
    if dead is None:
        return {}, None
    bias, at = dead.bias, None
    if bias is not None and id(bias["tensor"]) in facts.names:
        name = facts.name(bias["tensor"])
        at = set_at(facts.model, name, facts.tracer.user)
        made = f" (set at line {at['line']}: `{at['code']}`)" if at else ""
        cause = f"; every value of `{name}`{made} is in that region ({bias['min']:.3g} to {bias['max']:.3g})"
        remedy = f"`{name}`{made} alone puts every unit there: initialise it at 0 or a small positive value (a " \
                 "leaky activation such as LeakyReLU or GELU keeps a gradient in that region)"
    elif rec.op.startswith(("clamp", "clip", "hardtanh", "relu6", "threshold")):
        cause, remedy = "", f"its bounds leave the whole range of its inputs in the dead region ({dead.region}): set " \
                            "them inside the range of the data, or rescale what feeds it"
    else:
        cause, remedy = "", "every input is in its dead region: normalise what feeds it (BatchNorm, LayerNorm), " \
                            "check its sign and the init of the layer before, lower the learning rate if the units " \
                            "died in training, or use a leaky activation (LeakyReLU, GELU)"
    readers = [facts.name(p) for p in params if id(p) in rec.readers]
    span = f"; inputs from {dead.span[0]:.3g} to {dead.span[1]:.3g}" if dead.span else ""
    return {"dead": dead.dead, "total": dead.total, "region": dead.region, "span": span, "cause": cause,
            "remedy": remedy, "readers": f"; {listed(readers, 3)} read its output, which is all zeros" if readers else ""}, at


def _where(facts: TraceFacts, rec: ZeroOp, fields: dict[str, Any]) -> tuple[str, str | None]:
    """Where the op ran, as text: its user line, and the module whose forward ran it when no user line did."""
    module = next((n or "(the model)" for n, m in facts.model.named_modules() if m is rec.module), None) \
        if rec.module is not None else None
    if fields["line"] is not None:
        return f"at line {fields['line']} of {fields['file']}", module
    if module is not None:
        return f"in module `{module}` ({type(rec.module).__name__})", module
    return "(no line of the project ran it)", None


@GP318.detector
def zeroed_by_op(facts: TraceFacts) -> Iterator[Finding]:
    for rec, params in zeroed(facts):
        src = rec.source if isinstance(rec.source, ZeroSource) else ZeroSource()
        names = [facts.name(p) for p in params]
        loc = rec.location or {}
        made = src.made_at
        fields: dict[str, Any] = {
            "count": len(names), "names": listed(names, 6), "op": OP_TEXT.get(rec.op, rec.op), "line": loc.get("line"),
            "file": str(loc.get("file", "?")).rsplit("/", 1)[-1], "shape": rec.shape, "expr": src.expr or "?",
            "made": f"; `{src.made_name}` was made at line {made['line']} (`{made['code']}`)" if made else "",
            "made_at": f" (line {made['line']}, `{made['code']}`)" if made else "",
            "later": _later(src), "number": src.rises[0] if src.rises else None, "inputs": ", ".join(src.inputs),
            "selectable": rec.selectable}
        evidence: dict[str, Any] = {"op": rec.op, "kind": rec.kind, "zero_operand": src.expr, "shape": rec.shape, "made_at": made,
                    "raised": src.rises[1] if src.rises else None, "computed_from": src.inputs}
        dead, made_dead = _dead_fields(facts, rec, params)
        if rec.dead is not None:
            fields.update(dead)
            evidence.update(dead=rec.dead.dead, of=rec.dead.total, region=rec.dead.region, input_range=rec.dead.span,
                            bias=None if rec.dead.bias is None else facts.name(rec.dead.bias["tensor"]), bias_set_at=made_dead)
        if rec.kind == "index":
            evidence.update(selected=0, of=rec.selectable)
        if rec.kind in ("dead", "index"):
            fields["where"], evidence["module"] = _where(facts, rec, fields)
        situation = _situation(rec, src)
        # the cause is where the zero operand was made (the mask, the weight); a ramp from 0 is shown where it weighs
        at = made if made is not None and situation not in (None, "scale_ramp", "random_draw") else rec.location
        evidence["op_location"] = rec.location
        yield GP318.finding(situation, parameters=names, location=made_dead or at, evidence=evidence, **fields)
