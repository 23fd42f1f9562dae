"""GP9xx: what an output may not see, measured (the facts, torch-free, and the Rule units).

GP901 an output sees later inputs in a model trained to predict the next element; GP902 an example's output depends
on another example of the batch; GP903 examples packed in one row see each other; GP904 (info) BatchNorm in train
mode couples the examples of a batch, by design.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gradprobe.findings import Finding, Rule, Situation
from gradprobe.checks.core.rule_text import and_more, file_line


@dataclass
class Explained:
    """Where a leak comes from, as far as it was measured."""

    layer: str | None = None  # the first block whose output already has the leak
    attention: str | None = None  # the attention call in that block, as called
    attention_line: dict | None = None  # the user's line that made that call (or called the library that made it)
    mask_line: dict | None = None  # the user's line that built the mask the attention used
    mask_how: str | None = None
    config_key: str | None = None  # a flag that, flipped, removes the leak ("config.is_causal")
    config_value: str | None = None  # its value here
    config_fix: str | None = None  # the value that removes it
    config_site: dict | None = None  # where the module holding that flag was built
    batch_cause: str | None = None  # a change of the call that removes it ("drop the all-ones attention_mask")
    batch_fix: str | None = None
    change_line: dict | None = None  # the user's line of the call whose change removes it
    call_line: dict | None = None  # the user's line that called the model (script mode)
    origin: str | None = None  # inside `layer`, the module that computes the leak (its output has it, its inputs not)
    origin_alone: bool = False  # ... and makes no attention call: the attention is not the cause
    origin_site: dict | None = None  # where that module was built, when the user's code built it

    def location(self) -> dict | None:
        if self.origin_alone:
            return self.mask_line or self.origin_site or self.config_site or self.call_line
        return self.mask_line or self.change_line or self.attention_line or self.config_site or self.call_line


@dataclass
class LeakFact:
    kind: str  # future | example | packed
    b: int
    t: int
    seen: list[tuple[int, int]]
    ratio: float
    explained: Explained = field(default_factory=Explained)
    segment_of: dict[int, int] = field(default_factory=dict)  # position -> packed example index (packed leaks)


@dataclass
class DepFacts:
    leaks: list[LeakFact] = field(default_factory=list)
    claim: str = ""  # how the next-element claim was read
    segments: str = ""  # how the packed rows were told
    batch_size: int = 0
    batchnorm: list[str] = field(default_factory=list)  # BatchNorm modules in train mode that explain example coupling
    batchnorm_leaks: list[LeakFact] = field(default_factory=list)
    outside: LeakFact | None = None  # a packed leak measured only outside the training path
    outside_how: str = ""


at = file_line


def _positions(seen: list[tuple[int, int]], limit: int = 6) -> str:
    return and_more([str(t) for t in sorted({t for _, t in seen})], limit)


def _where(e: Explained) -> str:
    parts = []
    if e.layer:
        parts.append(f"; the first module whose output has it is `{e.layer}`")
    if e.origin_alone:
        parts.append(f"; inside it, `{e.origin}` computes it (its inputs do not have it, its output does, and it makes no "
                     "attention call: the attention is not the cause)")
    elif e.attention:
        parts.append(f", whose attention call is {e.attention}")
    if e.mask_line and e.mask_how and (e.mask_how.startswith("view") or e.mask_how.startswith("reshape")):
        parts.append(f"; the batch axis is reinterpreted at {at(e.mask_line)} ({e.mask_how}: a transpose/permute keeps "
                     "the examples apart, a view does not)")
    elif e.mask_line:
        parts.append(f"; the mask it used was built at {at(e.mask_line)}" + (f" ({e.mask_how})" if e.mask_how else ""))
    if e.config_key:
        parts.append(f"; `{e.config_key}` is {e.config_value} here, and with {e.config_fix} it is gone (measured)")
    if e.batch_cause:
        parts.append(f"; {e.batch_cause}")
    return "".join(parts)


def _evidence(leak: LeakFact, extra: dict[str, Any]) -> dict[str, Any]:
    e = leak.explained
    return {"row": leak.b, "position": leak.t, "depends_on": [list(p) for p in leak.seen[:32]],
            "largest_leak_over_largest_allowed": (round(leak.ratio, 6) if leak.ratio != float("inf") else "inf"),
            "first_module": e.layer, "attention": e.attention, "mask_built_at": e.mask_line, "config_key": e.config_key,
            "config_value": e.config_value, "config_fix": e.config_fix, "call_change": e.batch_fix,
            "computed_by": e.origin, **extra}


GP901: Rule[DepFacts] = Rule(
    code="GP901", name="output-sees-future", severity="error", rank=18,
    summary="In a model trained to predict the next element, an output position depends on inputs after it: the model "
            "sees the answer it is trained to predict.",
    why="The loss compares output position t with input t+1. If output t can read input t+1 (a causal mask off by one, "
        "a sliding-window or custom mask on one config path, a decoder whose causal flag is off), training copies the "
        "next token instead of predicting it: the loss falls far below the data's entropy rate and generation, which "
        "has no future to read, is useless. Nothing raises.",
    example="mask = torch.triu(torch.ones(T, T), diagonal=2).bool()   # diagonal=1 hides t+1; 2 lets t see it\n"
            "att = att.masked_fill(mask, float('-inf'))",
    message="Output position {t} (row {b}) depends on input position(s) {seen} after it, in a model trained to predict "
            "the next element ({claim}){where}.",
    fix="Make the attention causal on this path: position t may see positions <= t only (torch.tril(ones(T, T)) as the "
        "kept part, or triu(..., diagonal=1) as the masked part; is_causal=True for scaled_dot_product_attention).",
    situations={
        "computed_by_module": Situation(
            when="a module that makes no attention call computes the leak (a statistic over the positions)", message=None,
            fix="`{origin}` mixes the positions itself (measured: its inputs do not depend on later positions, its output "
                "does): a statistic over the sequence (a mean, a softmax, a norm over the position axis) read back at "
                "every position. Compute it per position, or from positions <= t only, in a model trained to predict "
                "the next element."),
        "config_flag": Situation(when="a flag of the model's configuration switches the mask", message=None,
                                 fix="Set `{key}` to {good} for training a next-element predictor (measured: with it, "
                                     "output t depends on no later input); the value {value} is only for a model not "
                                     "trained on shifted targets (an encoder, an embedding model)."),
    },
)


@GP901.detector
def detect_future(facts: DepFacts) -> Iterator[Finding]:
    leaks = [lf for lf in facts.leaks if lf.kind == "future"]
    if not leaks:
        return
    first = min(leaks, key=lambda lf: (lf.t, lf.b))
    e = first.explained
    situation = "computed_by_module" if e.origin_alone else "config_flag" if e.config_key and not e.mask_line else None
    yield GP901.finding(situation, location=e.location(),
                        evidence=_evidence(first, {"leaking_samples": len(leaks), "claim": facts.claim}),
                        t=first.t, b=first.b, seen=_positions(first.seen), claim=facts.claim, where=_where(e),
                        key=e.config_key or "", good=e.config_fix or "", value=e.config_value or "", origin=e.origin or "")


GP902: Rule[DepFacts] = Rule(
    code="GP902", name="examples-see-each-other", severity="error", rank=19,
    summary="The output of one example of the batch depends on the input of another: the examples are not independent.",
    why="Each example's output should be computed from that example alone. A reshape or transpose that mixes the batch "
        "axis with another, attention or a pooling over the wrong axis, or a mask broadcast over the batch lets an "
        "example read the others: training looks fine, and the model fails when called on one example (inference).",
    example="x = x.view(T, B, D)   # the tensor is (B, T, D): rows now mix examples\n"
            "h = self.attn(x)",
    message="The output of example {b}{position} depends on the input of example(s) {others} in the same batch{where}.",
    fix="Keep every operation on its own example: check the reshapes/transposes between the batch axis and the others "
        "and the axis each attention, pooling or normalisation runs over.",
    situations={
        "computed_by_module": Situation(
            when="a module that makes no attention call computes the leak (a statistic over the batch)", message=None,
            fix="`{origin}` mixes the examples itself (measured: its inputs do not depend on the other examples, its "
                "output does): a statistic over the batch (a mean, a softmax, a norm over the batch axis, or over "
                "batch and positions flattened together) read back by every example. Compute it per example."),
    },
)


@GP902.detector
def detect_examples(facts: DepFacts) -> Iterator[Finding]:
    leaks = [lf for lf in facts.leaks if lf.kind == "example"]
    if not leaks:
        return
    first = leaks[0]
    others = sorted({b for b, _ in first.seen})
    yield GP902.finding("computed_by_module" if first.explained.origin_alone else None, location=first.explained.location(),
                        evidence=_evidence(first, {"leaking_samples": len(leaks), "batch_size": facts.batch_size}),
                        b=first.b, position=f" (position {first.t})" if first.t else "",
                        others=", ".join(map(str, others[:8])), where=_where(first.explained),
                        origin=first.explained.origin or "")


GP903: Rule[DepFacts] = Rule(
    code="GP903", name="packed-examples-see-each-other", severity="error", rank=19,
    summary="Examples packed into one row (padding-free batches) depend on each other: a token reads the tokens of "
            "another example of its row.",
    why="Packing puts several examples in one row and relies on the attention to keep them apart: position ids that "
        "restart, cu_seqlens for FlashAttention, or a block-diagonal mask. When the path the training runs ignores "
        "them (an all-ones attention_mask that turns off transformers' packed-sequence detection, a KV cache built by "
        "default, FlashAttention kwargs passed to an sdpa/eager attention), every example attends to the ones packed "
        "before it: the loss is lower than it should be and the model learns from context it will never have.",
    example="batch = DataCollatorWithFlattening()(features)      # input_ids, labels, position_ids restarting\n"
            "out = model(**batch, attention_mask=torch.ones_like(batch['input_ids']))  # all ones: one long sequence",
    message="In packed row {row}, the token at position {t} (example {example} of the row) depends on position(s) "
            "{seen} of other example(s) packed in the same row ({segments}){where}.",
    fix="Keep the packed examples apart on the path the training runs: pass position_ids that restart and no 2-D "
        "attention_mask (transformers then builds a block-diagonal mask), call the model with use_cache=False, or use "
        "an attention implementation that reads cu_seqlens (flash_attention_2); or pad the examples instead of "
        "packing them.",
    situations={
        "outside": Situation(
            when="the training path keeps them apart, but the model called outside it (with use_cache=True) does not",
            severity="info",
            message="In the path the training runs, the examples packed in a row stay apart ({segments}, measured); "
                    "called {outside}, the token at position {t} of row {row} depends on position(s) {seen} of another "
                    "packed example.",
            fix="Nothing to fix for training. Call the model with use_cache=False whenever it gets packed rows outside "
                "this path (an evaluation loop of your own)."),
    },
)


@GP903.detector
def detect_packed(facts: DepFacts) -> Iterator[Finding]:
    leaks = [lf for lf in facts.leaks if lf.kind == "packed"]
    if leaks:
        first = leaks[0]
        yield GP903.finding(location=first.explained.location(),
                            evidence=_evidence(first, {"leaking_samples": len(leaks), "segments": facts.segments}),
                            row=first.b, t=first.t, example=first.segment_of.get(first.t, "?"),
                            seen=_positions(first.seen), segments=facts.segments, where=_where(first.explained))
    elif facts.outside is not None:
        o = facts.outside
        yield GP903.finding("outside", location=o.explained.location(),
                            evidence=_evidence(o, {"outside": facts.outside_how, "segments": facts.segments}),
                            row=o.b, t=o.t, seen=_positions(o.seen), segments=facts.segments, outside=facts.outside_how,
                            example="", where="")


GP904: Rule[DepFacts] = Rule(
    code="GP904", name="batch-statistics-couple-examples", severity="info", rank=99,
    summary="BatchNorm in train mode makes every output depend on every example of the batch: by design, said so the "
            "dependency is not taken for a leak.",
    why="BatchNorm normalises with the batch's own mean and variance while training, so each example's output moves "
        "with the others. That is how it works, and it is gone in eval mode (running statistics); it is reported as a "
        "measured fact, not a bug.",
    example="nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())   # model.train()",
    message="The output of example {b} depends on other examples of the batch through BatchNorm in train mode ({names}); "
            "with those modules in eval mode the examples are independent (measured). This is by design.",
    fix="Nothing to fix. Use GroupNorm/LayerNorm if examples must not influence each other while training (very small "
        "batches, or per-example gradients).",
)


@GP904.detector
def detect_batchnorm(facts: DepFacts) -> Iterator[Finding]:
    if facts.batchnorm and facts.batchnorm_leaks:
        first = facts.batchnorm_leaks[0]
        shown = and_more(facts.batchnorm, 4)
        yield GP904.finding(evidence={"modules": facts.batchnorm[:16], "row": first.b,
                                      "depends_on_rows": sorted({b for b, _ in first.seen})},
                            b=first.b, names=shown)


RULES: tuple[Rule[DepFacts], ...] = (GP901, GP902, GP903, GP904)
