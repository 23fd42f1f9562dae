"""GP306, GP307, GP311-GP314: what the gradients that did arrive say (zero, non-finite, unused, spread, hooks, reads).

Each rule reads the measured `TraceFacts` (checks/trace/gradient_facts.py) after the cut rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from gradprobe.checks.core.step import module_of
from gradprobe.checks.trace.gradient_facts import TraceFacts
from gradprobe.checks.core.rule_text import line_of, listed
from gradprobe.checks.trace.zeroing_rules import zeroed_ids
from gradprobe.findings import Finding, Rule, Situation

GP306: Rule[TraceFacts] = Rule(
    code="GP306", name="zero-gradient", severity="warning", rank=99,
    summary="A parameter's gradient is exactly zero (info when a zero-initialised partner such as LoRA B or a closed "
            "gate explains it).",
    why="Masked out, a dead ReLU, all labels ignored, or an attention mask that hides it: the parameter cannot learn "
        "from this batch.",
    example="attention_mask zero on the positions that use the parameter",
    message="{count} parameter(s) got an exactly-zero gradient: {names} (masked out, a dead ReLU, ignored labels, or a "
            "mask hiding them).",
    fix="Check masks, ignore-index labels and activations on the path of this parameter.",
    situations={
        "initialisation": Situation(
            when="a zero-initialised partner multiplies the parameter (LoRA B, a gate that starts closed), seen at one "
                 "step only (trace_grad_path, a script's first step)",
            severity="info",
            message="{count} parameter(s) got an exactly-zero gradient at this step because a zero-initialised partner "
                    "multiplies them ({partners}): expected at the first step (a LoRA B, a gate that starts closed), and "
                    "by design only if the partner moves at the next steps, which one step cannot show.",
            fix="Nothing to fix if the partner is zero-initialised on purpose and moves: audit_training (or diagnose on "
                "a build_model() target) runs real optimizer steps and checks that it does."),
        "initialisation_checked": Situation(
            when="a zero-initialised partner multiplies the parameter, and real optimizer steps showed the partner move "
                 "and the parameter then get a gradient",
            severity="info",
            message="{count} parameter(s) got an exactly-zero gradient at the diagnosed step because a zero-initialised "
                    "partner multiplies them ({partners}); checked over {steps} more real optimizer step(s) after it: "
                    "{measured}. By design (a LoRA B, a gate that starts closed).",
            fix="Nothing to fix: the partner is zero-initialised on purpose, and it trains."),
        "partner_zeroed": Situation(
            when="the zero-initialised partner never moved because its gradient was written to zero (or None) between "
                 "backward() and optimizer.step() at every step",
            severity="error",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient because a zero-initialised partner "
                    "multiplies them ({partners}), and the partner never moved over {steps} real optimizer step(s): its "
                    "gradient was non-zero after backward() (norm {before:.3g}) and {after} when optimizer.step() ran, "
                    "written by {op} at {line}. Not by design: while the partner stays zero they never get a gradient.",
            fix="Keep {op} at {line} from writing the gradient of {partners} to zero before optimizer.step(): check "
                "which parameters it selects and its threshold (a clip value of 0 zeroes every gradient); a "
                "zero-initialised partner must be updated for the parameters it multiplies to learn."),
        "partner_lr_zero": Situation(
            when="the zero-initialised partner never moved because its parameter group's learning rate was 0 at every step",
            severity="error",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient because a zero-initialised partner "
                    "multiplies them ({partners}), and the partner never moved over {steps} real optimizer step(s): its "
                    "parameter group's learning rate was {lrs} when optimizer.step() ran ({line}). Not by design: while "
                    "the partner stays zero they never get a gradient.",
            fix="Give the parameter group that holds {partners} a positive learning rate where it is set ({line}); a "
                "zero-initialised partner with lr 0 keeps the parameters it multiplies at a zero gradient for good."),
        "partner_not_in_optimizer": Situation(
            when="the zero-initialised partner never moved because it is in no parameter group of the optimizer",
            severity="error",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient because a zero-initialised partner "
                    "multiplies them ({partners}), and the partner never moved over {steps} real optimizer step(s): it "
                    "gets a gradient but is in no parameter group of the optimizer ({line}). Not by design: while the "
                    "partner stays zero they never get a gradient.",
            fix="Add {partners} to the optimizer built at {line} (an optimizer filter that keeps one half of an adapter "
                "and leaves out its zero-initialised half trains neither)."),
        "partner_stuck": Situation(
            when="the zero-initialised partner never moved over the steps for another measured reason (frozen, a "
                 "non-finite gradient, no gradient, a step that left it unchanged)",
            severity="error",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient because a zero-initialised partner "
                    "multiplies them ({partners}), and the partner never moved over {steps} real optimizer step(s): "
                    "{reason}. Not by design: while the partner stays zero they never get a gradient.",
            fix="Find what keeps {partners} from changing ({reason}) and let optimizer.step() update it; the parameters "
                "it multiplies get a gradient only once it has moved."),
        "partner_moved_still_zero": Situation(
            when="the zero-initialised partner moved over the steps, but the parameter still got an exactly-zero "
                 "gradient at every step after it",
            severity="warning",
            message="{count} parameter(s) ({names}) got an exactly-zero gradient at every one of {steps} real optimizer "
                    "step(s), although the zero-initialised partner said to explain it ({partners}) moved: the zero is "
                    "not the initialisation (masked out, a dead ReLU, ignored labels?).",
            fix="The partner moves, so look elsewhere: check the masks, activations and ignore-index labels on the path "
                "from {partners} to {names}."),
    },
)

GP307: Rule[TraceFacts] = Rule(
    code="GP307", name="nonfinite-gradient", severity="error", rank=31,
    summary="A gradient holds NaN or Inf.",
    why="One NaN poisons every parameter the optimizer updates with it.",
    example="torch.sqrt(x) at x == 0, log(0), division by a zero norm",
    message="{count} parameter(s) got NaN/Inf gradients: {names}.",
    fix="Guard the op at the reported line (clamp, eps, log1p, safe norms).",
    situations={
        "scaler_overflow": Situation(
            when="a GradScaler scaled a finite loss for this backward: the gradients overflowed float16 at its scale, and "
                 "GradScaler skips the step and halves the scale, as it does at the start of healthy fp16 training",
            severity="info",
            message="{count} parameter(s) got NaN/Inf gradients ({names}) from a loss that was finite ({loss}) before "
                    "the GradScaler multiplied it by {scale:g} at {line}: float16 overflowed at that scale, so the "
                    "scaler skips this step and halves its scale, as designed.",
            fix="Nothing to change for this step: audit_training (or diagnose with steps) shows whether the scale "
                "settles; GP617 is raised if every step is still skipped at a scale of 1 or less."),
    },
)

GP311: Rule[TraceFacts] = Rule(
    code="GP311", name="unused-parameter", severity="warning", rank=99,
    summary="A trainable parameter was never read by the forward on this batch.",
    why="It cannot get a gradient; DDP will also complain about it.",
    example="self.aux_head = nn.Linear(...)  # never called in forward",
    message="{count} trainable parameter(s) were never read by the forward on this batch: {names}.",
    fix="Use it, freeze it, or remove it (DDP: find_unused_parameters=True if it is conditional).",
)

GP312: Rule[TraceFacts] = Rule(
    code="GP312", name="vanishing-or-exploding", severity="warning", rank=99,
    summary="Per-layer gradient norms span more than a set ratio.",
    why="Layers far below their neighbours barely learn; far above, they destabilise training.",
    example="a 50-layer plain MLP with sigmoid activations",
    message="Per-module gradient norms span {ratio:.1e}x: {lo} has {lo_norm:.2e}, {hi} has {hi_norm:.2e}.",
    fix="Normalisation layers, residual connections, better init, gradient clipping.",
)

GP313: Rule[TraceFacts] = Rule(
    code="GP313", name="grad-hook-altered", severity="warning", rank=90,  # before GP306: the hook is why it is zero
    summary="A registered hook changed the gradient.",
    why="A tensor or module backward hook that returns a new value replaces the gradient the optimizer sees.",
    example="p.register_hook(lambda g: g * 0)",
    message="`{name}` has {count} gradient hook(s) and its gradient is {grad}: a hook likely replaced it{registered}.",
    fix="Check the hook; return None from hooks that only observe.",
)

GP314: Rule[TraceFacts] = Rule(
    code="GP314", name="non-leaf-grad-read", severity="warning", rank=99,
    summary="The user reads .grad of a non-leaf tensor.",
    why="Only leaves get .grad; a non-leaf's .grad stays None without retain_grad().",
    example="h = self.fc(x); ...; print(h.grad)",
    message="The step reads .grad of a non-leaf tensor ({count} time(s)); it stays None without retain_grad().",
    fix="Call h.retain_grad() before backward, or read the leaf parameter's .grad.",
)

SPREAD_RATIO = 1e6  # GP312: per-module gradient norms further apart than this


@GP306.detector
def zero_gradient(facts: TraceFacts) -> Iterator[Finding]:
    if facts.limited:
        return
    located = zeroed_ids(facts)  # GP318 names the op that zeroed these
    zero_rest = [facts.name(p) for p in facts.zero
                 if id(p) not in facts.attributed and id(p) not in located and facts.wanted(facts.name(p))]
    if zero_rest:
        yield GP306.finding(parameters=zero_rest, evidence={"zero": len(zero_rest)}, count=len(zero_rest),
                            names=listed(zero_rest, 6))
    init_names = facts.init_names()
    if init_names:
        yield GP306.finding("initialisation", parameters=list(init_names),
                            evidence={"zero_initialised_partners": init_names}, count=len(init_names),
                            partners=listed(sorted(set(init_names.values())), 3))


@GP307.detector
def nonfinite_gradient(facts: TraceFacts) -> Iterator[Finding]:
    names = facts.wanted_names(facts.nonfinite)
    if names:
        yield GP307.finding(parameters=names, location=facts.step.nonfinite_location,
                            evidence={"anomaly": facts.step.nonfinite_anomaly}, count=len(names),
                            names=listed(names, 6, more=False))


def scaler_overflow(f: Finding, loss: float, scale: float, line: str) -> Finding:
    """GP307 `f` measured again in the light of a GradScaler that scaled a finite loss (diagnose's step saw it)."""
    names = list(f["parameters"])
    return GP307.finding("scaler_overflow", parameters=names, location=f["location"],
                         evidence={**f["evidence"], "loss_before_scaling": loss, "scale": scale}, count=len(names),
                         names=listed(names, 6, more=False), loss=f"{loss:.4g}", scale=scale, line=line)


@GP311.detector
def unused_parameter(facts: TraceFacts) -> Iterator[Finding]:
    names = [n for n in facts.wanted_names(facts.unused) if n not in facts.crossed]
    if names and facts.tracer.backward_calls and not facts.tracer.backward_error:
        yield GP311.finding(parameters=names, evidence={"unused": len(names)}, count=len(names), names=listed(names, 6))


@GP312.detector
def norm_spread(facts: TraceFacts) -> Iterator[Finding]:
    per_module = facts.module_norms
    if len(per_module) < 3:
        return
    hi = max(per_module, key=lambda m: per_module[m])
    lo = min(per_module, key=lambda m: per_module[m])
    ratio = per_module[hi] / per_module[lo]
    if ratio > SPREAD_RATIO:
        ordered = sorted(per_module.items(), key=lambda kv: kv[1])
        yield GP312.finding(
            parameters=[n for n, _ in facts.model.named_parameters() if module_of(n) in (lo, hi)],
            evidence={"ratio": ratio, "norms": dict(ordered[:5] + ordered[-5:])},
            ratio=ratio, lo=lo, lo_norm=per_module[lo], hi=hi, hi_norm=per_module[hi])


@GP313.detector
def hook_altered(facts: TraceFacts) -> Iterator[Finding]:
    for h in facts.hooked:
        at = h.registered_at[1] if h.registered_at else None
        yield GP313.finding(
            parameters=[h.name], location=at,
            evidence={"hooks": [getattr(f, "__qualname__", repr(f)) for f in h.hooks.values()]},
            name=h.name, count=len(h.hooks), grad=h.grad, registered=f" (registered at {line_of(at)})" if at else "")


@GP314.detector
def nonleaf_grad_read(facts: TraceFacts) -> Iterator[Finding]:
    reads = facts.tracer.nonleaf_grad_reads
    if reads:
        yield GP314.finding(location=reads[0], evidence={"reads": reads[:5]}, count=len(reads))
