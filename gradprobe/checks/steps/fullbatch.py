"""The accumulated gradient against the full-batch one, and GP611 (accumulation divided twice).

When an optimizer step of the build_model()/train_step form is fed by k > 1 backward() calls, the observer keeps the
pre-step copy of the weights its update norm already took (observe.py `keep_accumulating`; one copy, once per audit).
After the user's call has returned, `measure` puts those weights back for a moment and takes the gradient of the
same batch as ONE batch: the target's `loss_fn(model(batch), batch)` (or the model's own `.loss`), with
torch.autograd.grad, so no `.grad` is touched; the random state and the buffers (BatchNorm statistics) are restored
and the trained weights put back. The gradient is taken only for the parameters nearest the loss (per group, those
holding 5% of its elements; `nearest`), so the backward stops after the last layers: accumulation scales the whole
gradient vector by one factor, which any subset of it shows. The accumulated norm is taken over the same
parameters. A target with neither a loss_fn nor a `.loss` is not measured (its default loss is
a random projection, not the step's loss). Nothing here is blamed on the user: a failure is a left-out line.

With micro-batches of one batch, the accumulated gradient should equal the full-batch one (ratio 1.00). A ratio of
1/k means the loss was divided by k twice (`loss / accum` inside the step and again by the trainer); a ratio of k, not
divided at all (GP601). A token-mean loss normalised by the whole batch's token count has a constant factor far from
1/k but a ratio of 1.00: the ratio, not the factor, tells them apart.

Public reports: https://github.com/llm-random/llm-random/pull/529 ("losses are already divided by grad accumulation
steps", fixing a second division), https://github.com/huggingface/transformers/pull/35207 (the Trainer's loss
scaling under gradient accumulation).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from gradprobe.checks.core.step import call_model
from gradprobe.checks.steps.accumulation import described, divided_twice_at
from gradprobe.checks.steps.facts import AuditFacts, FullBatch, OptStep, at
from gradprobe.checks.steps.gradients import MEASURED_ONE, is_one_over_k
from gradprobe.findings import Finding, Rule, Situation

GP611: Rule[AuditFacts] = Rule(
    code="GP611", name="accumulation-divided-twice", severity="error", rank=40,
    summary="Gradient accumulation divides the loss by the number of micro-batches twice: the accumulated gradient is "
            "1/k of the full-batch gradient.",
    why="Dividing each of k micro-batch losses by k makes the accumulated gradient equal to the full batch's. Dividing "
        "again (the step divides by `accum_steps` and so does the trainer, or a loss already averaged over the whole "
        "batch is divided by k) leaves a gradient k times too small: the learning rate is effectively divided by k and "
        "gradient clipping thresholds mean something else. Nothing raises; training is just slower.",
    example="loss = loss_fn(model(mb)) / accum_steps   # and later\n(loss / accum_steps).backward()",
    message="{k} backward() calls from {line} feed one optimizer step ({step_line}); measured after it, from the same "
            "pre-step weights, the gradient of the same batch as one batch ({loss}) has norm {full:.4g} and the "
            "accumulated one {accumulated:.4g}: ratio {ratio:.3f}, 1/{k}. Each micro-batch loss was multiplied by "
            "{factor} before backward(): the division by {k} is applied twice.",
    fix="Divide each micro-batch loss by the number of accumulation steps once: keep one `/ accum_steps` (at {line} or "
        "where the loss is computed) and remove the other, so that the accumulated gradient equals the full-batch one.",
    situations={
        "graph": Situation(
            when="script mode, or a target without the step's loss (no full-batch gradient): the micro-batch losses' "
                 "graphs, read at backward(), show the division by k applied twice",
            message="{k} backward() calls from {line} feed one optimizer step ({step_line}). Read from each loss's "
                    "graph at backward(): a {reduction} multiplied by {ops}; over the {k} micro-batches the losses "
                    "weigh {mass:.3g} of one mean over the whole batch (1.00 when the division by {k} is applied "
                    "once): 1/{k}, the division by {k} is applied twice.",
            fix="Divide each micro-batch loss by {k} once: remove the division at {remove}, so that the {k} losses add up "
                "to one mean over the whole batch. A framework that accumulates (accelerate's `accelerator.backward()`, "
                "the Trainer's `gradient_accumulation_steps`) divides by {k} already: do not divide the loss yourself "
                "there."),
    },
)

FULL_BATCH_RULES: tuple[Rule[AuditFacts], ...] = (GP611,)

# per group, the parameters nearest the loss holding this share of its elements are compared (nearest)
NEAR_SHARE = 0.05
MAX_NODES = 1_000_000  # a larger graph is not walked: every parameter's gradient is then taken


@GP611.detector
def detect_divided_twice(facts: AuditFacts) -> Iterator[Finding]:
    fb = facts.full_batch
    if fb is None:  # not measured (script mode, no loss_fn): the losses' graphs
        yield from _divided_twice_in_graph(facts)
        return
    if fb.k < 2 or fb.zeroed_inside or fb.ratio is None:
        return
    if is_one_over_k(fb.ratio, fb.k):
        factor = _factor_text(fb)
        yield GP611.finding(location=fb.location, evidence=_evidence(fb), k=fb.k, line=at(fb.location),
                            step_line=at(fb.step_location), loss=fb.loss + _over(fb), full=fb.full, accumulated=fb.accumulated,
                            ratio=fb.ratio, factor=factor)


def _divided_twice_in_graph(facts: AuditFacts) -> Iterator[Finding]:
    """Without a full-batch gradient: the division by k applied twice, read from the micro-batch losses' graphs."""
    for step in facts.opt_steps:
        found = divided_twice_at(step, facts.scaler_steps)
        if found is not None:
            location, evidence, fields = described(found, step)
            yield GP611.finding("graph", location=location, evidence=evidence, **fields)
            return


def _factor_text(fb: FullBatch) -> str:
    known = {round(f, 12) for f in fb.factors if f is not None}
    if len(known) == 1 and len(fb.factors) == fb.k:
        f = known.pop()
        return f"{f:.4g} (1/{1 / f:.4g})" if f else "0"
    return "a constant factor"


def _over(fb: FullBatch) -> str:
    """Which parameters both gradients were taken over, when not all (nearest)."""
    if fb.compared >= fb.of_params:
        return ""
    return (f", over the {fb.compared} of {fb.of_params} parameters nearest the loss: {fb.elements:,} of "
            f"{fb.of_elements:,} elements")


def _evidence(fb: FullBatch) -> dict[str, Any]:
    return {"micro_batches": fb.k, "accumulated_norm": fb.accumulated, "full_batch_norm": fb.full,
            "ratio": round(fb.ratio, 6) if fb.ratio is not None else None, "full_batch_loss": fb.loss,
            "loss_factors": fb.factors, "compared_parameters": fb.compared, "of_parameters": fb.of_params,
            "compared_elements": fb.elements, "of_elements": fb.of_elements,
            "per_group": [{"group": g, "accumulated": a, "full_batch": f,
                           "ratio": round(a / f, 6) if a is not None and f else None} for g, a, f in fb.groups]}


def full_batch_facts(fb: FullBatch | None, left_out: str | None) -> dict[str, Any]:
    """facts.full_batch: the measured ratio per group, or why it was not measured."""
    if fb is None:
        return {"left_out": left_out} if left_out else {}
    return {"step": fb.call + 1, "at": at(fb.step_location), **_evidence(fb)}


def full_batch_line(fb: FullBatch | None) -> list[str]:
    """The all-clear line: the accumulated gradient as a multiple of the full-batch gradient, per group, when it is 1.00
    (another ratio is a finding, GP601 `measured` or GP611, never a line beside an all-clear)."""
    if fb is None or fb.ratio is None or abs(fb.ratio - 1) > MEASURED_ONE:
        return []
    groups = "; ".join(f"group {g} {a / f:.3f}x" for g, a, f in fb.groups if a is not None and f)
    return [f"accumulated gradient of {fb.k} micro-batches (step {fb.call + 1}, {at(fb.step_location)}) against the "
            f"gradient of the same batch as one batch ({fb.loss}{_over(fb)}, same pre-step weights, measured after the step): "
            f"{fb.ratio:.3f}x (norms {fb.accumulated:.4g} and {fb.full:.4g})" + (f"; {groups}" if groups else "")]


def _loss(loaded: Any, out: Any) -> tuple[torch.Tensor | None, str]:
    if loaded.loss_fn is not None:
        return loaded.loss_fn(out, loaded.batch), "loss_fn on the whole batch"
    hf = getattr(out, "loss", None) if not isinstance(out, torch.Tensor) else None
    return (hf, "the model's .loss on the whole batch") if isinstance(hf, torch.Tensor) else (None, "")


def measure(loaded: Any, observed: list[OptStep], step: OptStep, moving: list[torch.Tensor], copies: list[torch.Tensor],
            scale: float = 1.0) -> tuple[FullBatch | None, str | None]:
    """The full-batch gradient from the pre-step weights `copies` (of `moving`), beside the step's accumulated one."""
    if loaded.train_step is None:
        return None, "the default step runs one backward() per step"
    model = loaded.model
    index = next(i for i, s in enumerate(observed) if s is step)
    trained = [p.data for p in moving]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        for p, c in zip(moving, copies, strict=True):
            p.data = c
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            try:
                out = call_model(model, loaded.batch)
            except Exception as exc:
                if loaded.loss_fn is not None:
                    raise  # a batch the target's loss takes: the call is gradprobe's to make work
                # the train_step unpacks the batch itself: what one batch's loss is, only the target can say
                return None, (f"the batch is not the model's input (calling the model on it raised {type(exc).__name__}: "
                              f"{str(exc)[:120]}) and the target gives no loss_fn: the full-batch gradient needs the "
                              "step's loss on the whole batch (give `loss`, loss_fn(output, batch), and a batch the "
                              "model takes)")
            loss, source = _loss(loaded, out)
            if loss is None:
                return None, ("no loss_fn: the full-batch gradient needs the step's loss on the whole batch (give "
                              "`loss`, loss_fn(output, batch)); the model's output has no .loss")
            if loss.numel() != 1 or not loss.requires_grad:
                return None, "the loss on the whole batch is not a scalar that requires grad"
            groups = [[p for p in _group_params(step, moving, i) if p.requires_grad] for i in range(len(step.groups))]
            reached, groups = nearest(loss, groups)
            flat = [p for g in groups for p in g]
            grads = torch.autograd.grad(loss, flat, allow_unused=True)
    finally:
        for p, d in zip(moving, trained, strict=True):
            p.data = d
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    by_id = {id(p): g for p, g in zip(flat, grads, strict=True)}
    fb = _compare(step, index, groups, by_id, source, scale)
    fb.of_params, fb.of_elements = len(reached), sum(p.numel() for p in reached)
    return fb, None


def _group_params(step: OptStep, moving: list[torch.Tensor], index: int) -> list[torch.Tensor]:
    ids = set(step.groups[index].params)
    return [p for p in moving if id(p) in ids]


def depths(loss: torch.Tensor) -> dict[int, int] | None:
    """id(parameter) -> the longest path from the loss to it in the loss's graph. autograd computes a parameter's
    gradient through every node on a path from the loss to it, so the longest path bounds that work: a weight tied to
    the embedding is as far as the embedding. None: a graph over MAX_NODES nodes, not walked."""
    root = loss.grad_fn
    if root is None:
        return None
    edges: dict[Any, int] = {root: 0}  # node -> incoming edges not yet relaxed
    order, i = [root], 0
    while i < len(order):
        for nxt, _ in order[i].next_functions:
            if nxt is not None:
                if nxt not in edges:
                    edges[nxt] = 0
                    order.append(nxt)
                edges[nxt] += 1
        i += 1
        if i > MAX_NODES:
            return None
    depth, ready, out = {root: 0}, [root], {}
    while ready:  # Kahn's order: a node is relaxed once every path into it has been
        node = ready.pop()
        d = depth[node]
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor):
            out[id(var)] = d
        for nxt, _ in node.next_functions:
            if nxt is not None:
                depth[nxt] = max(depth.get(nxt, 0), d + 1)
                edges[nxt] -= 1
                if not edges[nxt]:
                    ready.append(nxt)
    return out


def nearest(loss: torch.Tensor, groups: list[list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Per group, the parameters nearest the loss (longest path, `depths`), the nearest first, until they hold
    NEAR_SHARE of the group's elements that the loss reaches (all those at the last depth taken). Accumulation scales
    the whole gradient: k micro-batch losses each multiplied by f give k*f times the full-batch gradient (mean losses
    of equal micro-batches), or exactly it (a token-mean normalised by the whole batch), as vectors, so every subset
    of the coordinates has the same ratio, and only the backward through the last layers is paid. Returns every
    parameter the loss reaches, and those kept per group."""
    try:
        depth = depths(loss)
    except Exception:  # a graph node of an unexpected kind: nothing is left out for it
        depth = None
    if depth is None:  # every parameter, as one backward would
        return [p for g in groups for p in g], groups
    out: list[list[torch.Tensor]] = []
    every: list[torch.Tensor] = []
    for params in groups:
        reached = sorted((p for p in params if id(p) in depth), key=lambda p: depth[id(p)])
        every += reached
        total, n = sum(p.numel() for p in reached), 0
        kept: list[torch.Tensor] = []
        for p in reached:
            if kept and n >= NEAR_SHARE * total and depth[id(p)] > depth[id(kept[-1])]:
                break
            kept.append(p)
            n += p.numel()
        out.append(kept)
    return every, out


def _norm(ts: list[torch.Tensor]) -> float:
    return float(sum(float((t.detach().double() ** 2).sum()) for t in ts) ** 0.5) if ts else 0.0


def _total(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(v * v for v in known) ** 0.5 if known else None


def _compare(step: OptStep, index: int, groups: list[list[torch.Tensor]], grads: Mapping[int, torch.Tensor | None],
             source: str, scale: float) -> FullBatch:
    """Both gradients over the same parameters (those `nearest` kept): the accumulated one from the norms the observer
    took after the last micro-batch backward() (before clipping), the full-batch one from `grads`."""
    rows: list[tuple[int, float | None, float | None]] = []
    acc_total = full_total = 0.0
    for g, params in zip(step.groups, groups, strict=True):
        full = _norm([t for p in params if (t := grads.get(id(p))) is not None])
        acc = _total([step.params[id(p)].grad_after_backward for p in params])
        acc = acc / scale if acc is not None else None
        rows.append((g.index, acc, full if params else None))
        acc_total += (acc or 0.0) ** 2
        full_total += full ** 2
    zeroed = any(0 < n < len(step.backwards) for _, n in step.zero_grads_between)
    compared = [p for ps in groups for p in ps]
    return FullBatch(call=step.call, step_index=index, k=len(step.backwards), location=step.backwards[0].location,
                     step_location=step.location, loss=source, accumulated=acc_total ** 0.5, full=full_total ** 0.5,
                     groups=rows, zeroed_inside=zeroed, compared=len(compared),
                     elements=sum(p.numel() for p in compared))
