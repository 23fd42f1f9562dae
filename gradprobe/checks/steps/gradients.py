"""GP6xx rules about the gradient an optimizer step is given: accumulation, clearing, writes between backward and step,
and gradient penalties that carry no graph."""

from __future__ import annotations

import math
from collections.abc import Iterator

from gradprobe.checks.steps.facts import AuditFacts, OptStep, at, listed
from gradprobe.findings import Finding, Rule, Situation

GP601: Rule[AuditFacts] = Rule(
    code="GP601", name="accumulation-not-averaged", severity="error", rank=40,
    summary="Gradient accumulation: several micro-batch losses are summed into one optimizer step without division, or "
            "zero_grad() inside the micro-step loop keeps only the last micro-batch.",
    why="backward() adds into .grad. Accumulating k micro-batches without dividing each loss by k gives a gradient k times "
        "the mean's (the learning rate is effectively k times larger); a zero_grad() between the micro-steps throws away "
        "every micro-batch but the last. Neither raises: the loss still goes down, just not as configured.",
    example="for mb in micro_batches: loss = loss_fn(model(mb)); loss.backward()   # no `/ accum_steps`\noptimizer.step()",
    message="{k} backward() calls from {line} add into one optimizer step ({step_line}) and the loss is not divided "
            "(its last operation is {top}): the step gets the sum of the {k} micro-batch gradients (norm {total:.3g}; the "
            "first micro-batch's alone: {first:.3g}), {k}x their mean.",
    fix="Divide each micro-batch loss by the number of accumulation steps before backward() at {line}: "
        "`(loss / accum_steps).backward()` (or scale by each micro-batch's share of the tokens).",
    situations={
        "measured": Situation(
            severity="warning",
            when="the build_model() form: the accumulated gradient measured against the same batch as one batch is "
                 "neither 1.00 (divided once), 1/k (GP611) nor explained by the pattern",
            message="{k} backward() calls from {line} feed one optimizer step ({step_line}); measured after it, from the "
                    "same pre-step weights, the accumulated gradient is {ratio:.3g}x the gradient of the same batch as "
                    "one batch ({loss}): the micro-batch losses do not add up to the one-batch loss (1.00x when they "
                    "do).",
            fix="Make the {k} micro-batch losses add up to the loss of the whole batch (divide each by {k}, or by the "
                "count of all the step's examples or tokens); check_equivalence compares the two gradients tensor by "
                "tensor and says which ones differ."),
        "zeroed_inside": Situation(
            when="zero_grad() runs between the micro-steps of one optimizer step",
            message="zero_grad() at {zero_line} runs between the {k} backward() calls from {line} that feed one optimizer "
                    "step ({step_line}): only the last micro-batch's gradient reaches the step.",
            fix="Call zero_grad() once per optimizer step, after optimizer.step() (or before the first micro-batch), not "
                "inside the micro-step loop at {zero_line}."),
    },
)

GP602: Rule[AuditFacts] = Rule(
    code="GP602", name="gradients-never-cleared", severity="error", rank=41,
    summary="Gradients are never cleared between optimizer steps, so every step adds all previous gradients.",
    why="PyTorch accumulates into .grad; without zero_grad() (or setting .grad to None) the k-th step uses the sum of k "
        "steps' gradients, which grows and points where past batches pointed.",
    example="loss.backward(); optimizer.step()   # no optimizer.zero_grad() anywhere in the loop",
    message="Gradients left from step {prev} were still there when backward() at {line} ran for the next step "
            "(norm {stale:.3g} before it): {cleared}, so {steps} optimizer steps each added onto the previous gradients.",
    fix="Call optimizer.zero_grad() once per step, before backward() at {line} or right after optimizer.step() at "
        "{step_line}.",
    situations={
        "misplaced": Situation(
            when="zero_grad() is called, but not between optimizer.step() and the next backward()",
            fix="Move the zero_grad() call so that it runs between optimizer.step() ({step_line}) and the next backward() "
                "({line}), once per step."),
    },
)

GP605: Rule[AuditFacts] = Rule(
    code="GP605", name="gradient-zeroed-before-step", severity="error", rank=42,
    summary="A gradient that backward() produced is set to zero (or None) by code that runs before optimizer.step().",
    why="Clipping with a max norm of 0, a callback that zeroes or deletes gradients, a hook on the gradient, or a "
        "zero_grad() placed between backward() and step(): the optimizer then sees no gradient and the parameter does "
        "not train, while the loss and backward look normal.",
    example="loss.backward(); clip_grad_norm_(model.parameters(), max_norm=0.0); optimizer.step()",
    message="The gradient of {count} parameter(s) ({names}) was non-zero after backward() (norm {before:.3g}) and "
            "{after} when optimizer.step() ran at {step_line}: {op} at {line} changed it.",
    fix="Do not write the gradient to zero between backward() and step() at {line}: clip with a positive max norm, "
        "and keep callbacks from zeroing or deleting .grad before the step.",
    situations={
        "zero_grad": Situation(
            when="the line is a zero_grad() call between backward() and step()",
            fix="Move zero_grad() at {line} before the forward pass or after optimizer.step() ({step_line}); between "
                "backward() and step() it erases the gradient the step needs."),
        "outside": Situation(
            when="no project line wrote it (a gradient hook, or code outside the project)",
            message="The gradient of {count} parameter(s) ({names}) was non-zero after backward() (norm {before:.3g}) "
                    "and {after} when optimizer.step() ran at {step_line}, changed by code outside the project.",
            fix="Look for gradient hooks (register_hook, register_post_accumulate_grad_hook) or library callbacks that "
                "zero or delete .grad before the step, and remove them."),
    },
)

GP608: Rule[AuditFacts] = Rule(
    code="GP608", name="penalty-without-graph", severity="error", rank=43,
    summary="A gradient penalty computed with torch.autograd.grad(..., create_graph=False): the penalty is a constant "
            "and trains nothing.",
    why="Without create_graph=True the gradients autograd.grad returns have no graph. A penalty built from them (WGAN-GP, "
        "R1, input-gradient regularisation) adds a number to the loss, but its gradient with respect to the parameters "
        "is zero, so the constraint is never enforced.",
    example="g = torch.autograd.grad(d_interp.sum(), interp)[0]; loss = w_loss + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()",
    message="torch.autograd.grad at {line} ran without create_graph=True and what it returned was used in a loss that "
            "was backpropagated ({calls} call(s) over the steps): that term has no path to the parameters.",
    fix="Pass create_graph=True (and retain_graph=True when the outputs are used again) to torch.autograd.grad at {line}.",
)


SAME_LOSS = 1e-6  # relative: one loss recomputed through each part (cached features) has one value to float32 rounding
MEASURED_ONE = 0.1  # a full-batch ratio within 10% of 1.00: the division is right, whatever the pattern
LOW, HIGH = 0.75, 1.33  # the band of 1/k (is_one_over_k)


def one_loss_in_parts(step: OptStep) -> bool:
    """The step's k backward() calls backpropagate one loss value, each adding a different gradient: the gradient of one
    loss over the whole batch computed in parts (contrastive accumulation with cached features: each micro-batch's
    features recomputed with gradient in place of their cached copy). Measured: the losses' values are equal, and the
    norm after the j-th backward() is not j times the first (which the same gradient added k times gives)."""
    bw = step.backwards
    values = [b.value for b in bw]
    if len(bw) < 2 or any(v is None or not math.isfinite(v) for v in values):
        return False
    known = [v for v in values if v is not None]
    if max(known) - min(known) > SAME_LOSS * max(max(abs(v) for v in known), 1e-12):
        return False
    first = bw[0].after_norm
    repeated = all(abs(b.after_norm - (j + 1) * first) <= 1e-4 * (j + 1) * first for j, b in enumerate(bw))
    return first > 0 and not repeated


def _measured_one(facts: AuditFacts, step: OptStep) -> bool:
    """The full-batch gradient was measured for this step (the build_model() form) and the ratio is 1.00."""
    fb = facts.full_batch
    return fb is not None and fb.call == step.call and fb.ratio is not None and abs(fb.ratio - 1) <= MEASURED_ONE


def _measured_off(facts: AuditFacts, step: OptStep) -> bool:
    """The full-batch ratio of this step is measured and neither 1.00 nor 1/k (GP611's)."""
    fb = facts.full_batch
    if fb is None or fb.call != step.call or fb.ratio is None or fb.zeroed_inside or fb.k < 2:
        return False
    return abs(fb.ratio - 1) > MEASURED_ONE and not is_one_over_k(fb.ratio, fb.k)


def is_one_over_k(ratio: float, k: int) -> bool:
    """A full-batch ratio within the band of 1/k (GP611: divided twice); dropout and BatchNorm make the two gradients
    differ a little."""
    return LOW <= ratio * k <= HIGH


def _same_line(step: OptStep) -> str | None:
    lines = {at(b.location) for b in step.backwards}
    return lines.pop() if len(lines) == 1 and all(b.location for b in step.backwards) else None


@GP601.detector
def detect_accumulation(facts: AuditFacts) -> Iterator[Finding]:
    seen: set[str] = set()
    for step in facts.opt_steps:
        bw, line = step.backwards, _same_line(step)
        if len(bw) < 2 or line is None or line in seen or bw[0].stale:
            continue
        inside = [loc for loc, n in step.zero_grads_between if 0 < n < len(bw)]
        ev = {"backward_calls": len(bw), "loss_top": [b.top for b in bw], "call": step.call,
              "grad_norm_after_each_backward": [round(b.after_norm, 6) for b in bw]}
        loc = bw[0].location
        if inside:
            seen.add(line)
            yield GP601.finding("zeroed_inside", location=inside[0], evidence=ev, k=len(bw), line=line,
                                step_line=at(step.location), zero_line=at(inside[0]))
        elif (not any(b.scaled for b in bw) and bw[0].after_norm > 0 and not _measured_one(facts, step)
              and not one_loss_in_parts(step)):
            seen.add(line)
            yield GP601.finding(location=loc, evidence=ev, k=len(bw), line=line, step_line=at(step.location),
                                top=bw[0].top or "no operation", total=bw[-1].after_norm, first=bw[0].after_norm)
        elif _measured_off(facts, step) and not one_loss_in_parts(step):
            seen.add(line)
            fb = facts.full_batch
            assert fb is not None and fb.ratio is not None
            yield GP601.finding("measured", location=loc, evidence=dict(ev, full_batch_ratio=round(fb.ratio, 6)),
                                k=len(bw), line=line, step_line=at(step.location), ratio=fb.ratio, loss=fb.loss)


@GP602.detector
def detect_never_cleared(facts: AuditFacts) -> Iterator[Finding]:
    stale = [(i, s) for i, s in enumerate(facts.opt_steps) if s.backwards and s.backwards[0].stale]
    if not stale:
        return
    i, step = stale[0]
    prev = facts.opt_steps[i - 1] if i else step
    zero = [e for e in facts.events if e.kind == "zero_grad"]
    bw = step.backwards[0]
    cleared = ("zero_grad() was never called in the observed steps" if not zero
               else f"zero_grad() ran ({at(zero[0].location)}) but never between a step and the next backward()")
    yield GP602.finding(None if not zero else "misplaced", location=bw.location,
                        evidence={"stale_grad_norm": bw.stale_norm, "steps_with_stale_gradients": len(stale),
                                  "zero_grad_calls": len(zero)},
                        prev=f"{prev.call + 1} ({at(prev.location)})", line=at(bw.location), stale=bw.stale_norm,
                        cleared=cleared, steps=len(stale) + 1, step_line=at(prev.location))


@GP605.detector
def detect_zeroed_before_step(facts: AuditFacts) -> Iterator[Finding]:
    in_opt = facts.in_optimizer()
    by_line: dict[str, list] = {}
    for step in facts.opt_steps:
        for c in step.changes:
            if c.param in in_opt and c.before > 0 and not c.after:
                by_line.setdefault(at(c.location) if c.location else "", []).append((step, c))
    zero_lines = {at(e.location) for e in facts.events if e.kind == "zero_grad" and e.location}
    for line, hits in by_line.items():
        step, first = hits[0]
        names = sorted({facts.name(c.param) for _, c in hits})
        situation = "outside" if not line else "zero_grad" if line in zero_lines else None
        yield GP605.finding(situation, parameters=names, location=first.location,
                            evidence={"grad_norm_after_backward": first.before, "grad_at_step": first.after,
                                      "op": first.op, "steps": len({s.call for s, _ in hits})},
                            count=len(names), names=listed(names), before=first.before,
                            after="None" if first.after is None else "zero", step_line=at(step.location),
                            op=f"`{first.op}`" if first.op else "the call", line=line or "outside the project")


@GP608.detector
def detect_penalty_without_graph(facts: AuditFacts) -> Iterator[Finding]:
    by_line: dict[str, list] = {}
    for call in facts.grad_calls:
        if not call.create_graph and not call.inputs_are_parameters and call.used_in_backward:
            by_line.setdefault(at(call.location), []).append(call)
    for line, calls in by_line.items():
        yield GP608.finding(location=calls[0].location, evidence={"create_graph": False, "calls": len(calls),
                                                                   "outputs_used_in_a_backpropagated_loss": True},
                            line=line, calls=len(calls))


GRADIENT_RULES: tuple[Rule[AuditFacts], ...] = (GP601, GP602, GP605, GP608)
# what one watched step can show on its own (diagnose's script mode watches the script's first step)
ONE_STEP_RULES: tuple[Rule[AuditFacts], ...] = (GP605,)
