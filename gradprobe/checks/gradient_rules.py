"""GP306, GP307, GP311-GP314: what the gradients that did arrive say (zero, non-finite, unused, spread, hooks, reads).

Each rule reads the measured `TraceFacts` (checks/gradient_facts.py) after the cut rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from gradprobe.checks._step import module_of
from gradprobe.checks.gradient_facts import TraceFacts
from gradprobe.checks.rule_text import line_of, listed
from gradprobe.checks.zeroing_rules import zeroed_ids
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
            when="a zero-initialised partner multiplies the parameter (LoRA B, a gate that starts closed)",
            severity="info",
            message="{count} parameter(s) got an exactly-zero gradient at this step because a zero-initialised partner "
                    "multiplies them ({partners}): by design (a LoRA B, a gate that starts closed); they get gradients "
                    "once the partner has moved.",
            fix="Nothing to fix if the partner is zero-initialised on purpose."),
    },
)

GP307: Rule[TraceFacts] = Rule(
    code="GP307", name="nonfinite-gradient", severity="error", rank=31,
    summary="A gradient holds NaN or Inf.",
    why="One NaN poisons every parameter the optimizer updates with it.",
    example="torch.sqrt(x) at x == 0, log(0), division by a zero norm",
    message="{count} parameter(s) got NaN/Inf gradients: {names}.",
    fix="Guard the op at the reported line (clamp, eps, log1p, safe norms).",
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
