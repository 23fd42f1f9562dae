"""GP5xx as rule units: what one prompt-tuning step measured, and the rules that read it.

engine.py measures (the prompt, one traced step with the base model watched, the mask and
labels over the prompt's positions, the optimizer, what is trainable) into `PromptFacts`; each
rule here reads those facts and says what is wrong, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from gradprobe.findings import Finding, Location, Rule, Situation

Loc = dict[str, Any]
Site = Literal["optimizer", "freezing"]  # what made trainable base tensors part of training (a situation of GP503/GP508)


@dataclass
class NonLeafPrompt:
    name: str
    grad_fn: str | None  # the op that made it
    shape: list[int]
    dtype: str
    site: Loc | None  # where the user's code set the attribute


@dataclass
class IdCast:
    """A cut on the prompt's path whose integers then selected rows: the prompt turned into token ids."""

    parameters: list[str]
    op: Any
    location: Location | None
    evidence: dict[str, Any]  # the trace finding's evidence


@dataclass
class MaskOnPrompt:
    """The attention mask the base model received is 0 on every prompt position."""

    virtual_tokens: int
    location: Loc | None
    evidence: dict[str, Any]


@dataclass
class LabelsOnPrompt:
    """Labels whose length differs from the embedded sequence, or that are not the ignore index on the prompt's positions."""

    virtual_tokens: int
    location: Loc | None
    evidence: dict[str, Any]
    length: tuple[int, int] | None = None  # (labels, embedded sequence) when they differ
    slots: list[list[int]] | None = None  # the prompt's spans, when they are not one leading block (template slots)


@dataclass
class TrainableSite:
    """Where trainable base tensors became part of training."""

    location: Loc
    kind: Site

    @property
    def where(self) -> str:
        return f"line {self.location['line']} of {self.location['file'].rsplit('/', 1)[-1]}"


@dataclass
class TrainableBase:
    by_module: dict[str, int]  # module -> trainable values
    names: list[str]  # the trainable base parameters
    site: TrainableSite | None


@dataclass
class TiedEmbedding:
    name: str
    site: TrainableSite | None


@dataclass
class PromptFacts:
    """What one prompt-tuning step measured (every field empty unless measured: diagnose measures some alone)."""

    prompt_names: list[str] = field(default_factory=list)  # the prompt's parameters, sorted
    attr_names: list[str] = field(default_factory=list)  # the prompt's tensor attributes
    nonleaf: list[NonLeafPrompt] = field(default_factory=list)
    no_grad: list[str] = field(default_factory=list)  # prompt parameters with no (or a zero) gradient, not by design
    zero_grad: list[str] = field(default_factory=list)  # those whose gradient is exactly zero
    breaks: list[Finding] = field(default_factory=list)  # the trace's errors on the prompt's path
    id_casts: list[IdCast] = field(default_factory=list)
    base_input_ids: list[int] | None = None  # the shape of the input_ids the base model received
    base_inputs: dict[str, Any] | None = None
    generate_calls: list[dict[str, Any]] = field(default_factory=list)
    generate_breaks: list[Finding] = field(default_factory=list)  # cuts by no_grad / a non-scalar loss, generate() called
    mask: MaskOnPrompt | None = None
    labels: LabelsOnPrompt | None = None
    cache_call: dict[str, Any] | None = None  # the first training call of the base with a cache
    checkpoint_warnings: list[Loc | None] = field(default_factory=list)
    checkpoint_parameters: list[str] = field(default_factory=list)
    not_in_optimizer: list[str] = field(default_factory=list)
    optimizer: str | None = None
    optimizer_site: Loc | None = None
    trainable_base: TrainableBase | None = None
    tied: TiedEmbedding | None = None

    @property
    def loss_from_generate(self) -> bool:
        """generate() ran, and a no_grad cut is on the prompt's path, or the prompt got no gradient that an id cast explains."""
        return bool(self.generate_calls) and bool(self.generate_breaks or (self.no_grad and not self.id_casts))


GP501: Rule[PromptFacts] = Rule(
    code="GP501", name="prompt-gets-no-grad", severity="error", rank=36,
    summary="The soft prompt's gradient is None or zero after backward.",
    why="A prompt without gradient never changes: the run trains nothing.",
    example="loss.backward(); print(model.prompt.grad)  # None",
    message="The prompt gets no gradient: {names}.",
    fix="Follow the more precise finding (GP502-GP511) or evidence.break to the line that cuts the prompt's path.",
    situations={
        "zero": Situation(when="the gradient arrived and is exactly zero", message="The prompt gets a zero gradient: {names}."),
    },
)

GP502: Rule[PromptFacts] = Rule(
    code="GP502", name="prompt-through-input-ids", severity="error", rank=20,
    summary="The prompt was turned into token ids (concatenated to input_ids, cast to long).",
    why="An embedding lookup by integer ids has no gradient with respect to the ids: the prompt only selects rows of a "
        "frozen table.",
    example="input_ids = torch.cat([self.prompt.expand(b, -1), input_ids], 1).long()",
    message="The prompt is turned into token ids (`{op}` on the prompt{received}): an id lookup has no gradient, so the "
            "prompt never learns.",
    fix="Prepend embeddings, not ids: inputs_embeds = torch.cat([prompt.expand(b, -1, -1), wte(input_ids)], 1); "
        "lm(inputs_embeds=inputs_embeds, ...)",
)

GP503: Rule[PromptFacts] = Rule(
    code="GP503", name="base-not-frozen", severity="warning", rank=99,
    summary="Base-model parameters are trainable beside the prompt.",
    why="Prompt tuning means a frozen base; trainable base weights change the model and cost memory.",
    example="forgetting lm.requires_grad_(False)",
    message="{values:,} base-model values in {modules} module(s) are trainable beside the prompt.",
    fix="Freeze the base: model.lm.requires_grad_(False) (PEFT does this in get_peft_model).",
    situations={
        "optimizer": Situation(
            when="the optimizer takes the trainable base tensors",
            message="{values:,} base-model values in {modules} module(s) are trainable beside the prompt "
                    "(the optimizer built at {where} takes them)."),
        "freezing": Situation(
            when="the user's freezing code froze the rest of the base but left them trainable",
            message="{values:,} base-model values in {modules} module(s) are trainable beside the prompt "
                    "(the freezing code at {where} leaves them trainable)."),
    },
)

GP504: Rule[PromptFacts] = Rule(
    code="GP504", name="prompt-not-in-optimizer", severity="error", rank=32,
    summary="The prompt is not in the optimizer.",
    why="It gets a gradient but step() never updates it.",
    example="AdamW(model.prompt_encoder.parameters())  # prompt_embeddings left out",
    message="{count} prompt parameter(s) are not in the optimizer: {names}. They get gradients but never change.",
    fix="Pass the prompt (all trainable parameters): AdamW([p for p in model.parameters() if p.requires_grad])",
)

GP505: Rule[PromptFacts] = Rule(
    code="GP505", name="generate-in-training", severity="error", rank=21,
    summary="The loss is computed from generate(), which runs under no_grad.",
    why="generate() is decorated with @torch.no_grad(): its scores carry no history back to the prompt.",
    example="scores = lm.generate(inputs_embeds=..., output_scores=True).scores",
    message="The loss is computed from generate(), which runs under no_grad: nothing links it to the prompt.",
    fix="Train with a forward pass (teacher forcing): out = lm(inputs_embeds=..., labels=...); out.loss.backward()",
)

GP506: Rule[PromptFacts] = Rule(
    code="GP506", name="attention-mask-excludes-prompt", severity="error", rank=22,
    summary="The attention mask gives the prompt positions zero weight.",
    why="No position attends to the virtual tokens, so the loss does not depend on them and their gradient is zero.",
    example="attention_mask = F.pad(attention_mask, (n_prompt, 0))  # pads with 0",
    message="The attention mask passed to the base model is 0 on all {n_virt} prompt positions: nothing attends to the "
            "virtual tokens, so the loss does not depend on the prompt.",
    fix="Extend the mask with ones: attention_mask = F.pad(attention_mask, (n_prompt, 0), value=1)",
    situations={
        "zero_gradient": Situation(
            when="the prompt's gradient was measured exactly zero",
            message="The attention mask passed to the base model is 0 on all {n_virt} prompt positions: nothing attends "
                    "to the virtual tokens, so the loss does not depend on the prompt (its gradient is exactly zero)."),
    },
)

GP507: Rule[PromptFacts] = Rule(
    code="GP507", name="labels-misaligned", severity="error", rank=24,
    summary="Labels do not cover the prompt positions with the ignore index, or their length differs from the embedded "
            "sequence.",
    why="Shifted or mislabelled positions train the model on the wrong targets, or fail.",
    example="labels passed unchanged while inputs_embeds has n_prompt extra positions",
    message="labels on the {n_virt} prompt positions are not the ignore index -100: the model is trained to predict tokens "
            "at virtual positions.",
    fix="Prepend the ignore index: labels = torch.cat([labels.new_full((b, n_prompt), -100), labels], 1)",
    situations={
        "length": Situation(
            when="the labels' length differs from the embedded sequence",
            message="labels have length {labels_length} but the embedded sequence has {seq} positions ({n_virt} of them "
                    "virtual)."),
        "slots": Situation(
            when="the prompt vectors fill positions other than one leading block (template slots, a suffix)",
            fix="Set the labels to -100 at the positions the prompt vectors fill (spans {spans} here), e.g. labels = "
                "labels.masked_fill(is_prompt_slot, -100), keeping only the positions to predict."),
    },
)

GP508: Rule[PromptFacts] = Rule(
    code="GP508", name="tied-embedding-trained", severity="warning", rank=99,
    summary="The trainable set includes an input embedding tied to the output head.",
    why="Training one trains both: the output distribution moves with the embedding table.",
    example="model.transformer.wte.requires_grad_(True) on GPT-2 (lm_head is tied)",
    message="The input embedding `{name}` is trainable and tied to the output head: training it moves the output layer too.",
    fix="Keep the embedding frozen, or untie the head deliberately.",
    situations={
        "optimizer": Situation(
            when="the optimizer takes the embedding",
            message="The input embedding `{name}` is trainable and tied to the output head: training it moves the output "
                    "layer too (the optimizer built at {where} takes them)."),
        "freezing": Situation(
            when="the user's freezing code froze the rest of the base but left it trainable",
            message="The input embedding `{name}` is trainable and tied to the output head: training it moves the output "
                    "layer too (the freezing code at {where} leaves them trainable)."),
    },
)

GP509: Rule[PromptFacts] = Rule(
    code="GP509", name="cache-in-training", severity="warning", rank=99,
    summary="use_cache / past_key_values used in the training step.",
    why="A cache carried across steps holds stale keys/values from an old graph (or a freed one), and the prompt's "
        "positions can be skipped.",
    example="out = lm(inputs_embeds=x, past_key_values=past)",
    message="The training forward passes {what} to the base model.",
    fix="Pass use_cache=False in training and never carry past_key_values across steps.",
)

GP510: Rule[PromptFacts] = Rule(
    code="GP510", name="prompt-not-leaf", severity="error", rank=10,
    summary="The prompt is a non-leaf tensor.",
    why="nn.Parameter(x).to(...)/.half()/.cuda() returns a copy with history: it is not registered and never gets .grad.",
    example="self.prompt = nn.Parameter(torch.randn(8, d)).half()",
    message="The prompt `{name}` is a non-leaf tensor (made by {made_by}): it is not registered and never gets .grad.",
    fix="Create the tensor with its final dtype/device, then wrap: "
        "self.prompt = nn.Parameter(torch.randn(8, d, dtype=torch.float16))",
)

GP511: Rule[PromptFacts] = Rule(
    code="GP511", name="checkpointing-without-input-grad", severity="error", rank=23,
    summary="Reentrant gradient checkpointing with inputs that do not require grad.",
    why="Reentrant checkpoint returns outputs without history when no input requires grad: nothing inside reaches the "
        "trainable parameters.",
    example="model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True}) with a frozen "
            "embedding",
    message="Reentrant gradient checkpointing ran with no input requiring grad: the checkpointed blocks return outputs "
            "without history.",
    fix="Use use_reentrant=False, or call model.enable_input_require_grads() before training.",
)

# the order findings come in
PROMPT_RULES: tuple[Rule[PromptFacts], ...] = (GP510, GP502, GP505, GP506, GP507, GP509, GP511, GP504, GP503, GP508, GP501)


@GP510.detector
def prompt_not_leaf(facts: PromptFacts) -> Iterator[Finding]:
    for a in facts.nonleaf:
        yield GP510.finding(name=a.name, made_by=a.grad_fn or "?", parameters=[a.name], location=a.site,
                            evidence={"shape": a.shape, "dtype": a.dtype, "grad_fn": a.grad_fn})


@GP502.detector
def prompt_through_ids(facts: PromptFacts) -> Iterator[Finding]:
    received = f", then the base model receives input_ids {facts.base_input_ids}" if facts.base_input_ids is not None else ""
    for cast in facts.id_casts:
        yield GP502.finding(op=cast.op, received=received, parameters=cast.parameters, location=cast.location,
                            evidence={"break": cast.evidence, "base_inputs": facts.base_inputs})


@GP505.detector
def generate_in_training(facts: PromptFacts) -> Iterator[Finding]:
    if not facts.loss_from_generate:
        return
    gen_breaks = facts.generate_breaks
    cut = sorted(set(facts.prompt_names) & {n for f in gen_breaks for n in f["parameters"]})
    yield GP505.finding(parameters=cut or (facts.prompt_names if gen_breaks else facts.no_grad),
                        location=facts.generate_calls[0]["location"],
                        evidence={"break": gen_breaks[0]["evidence"] if gen_breaks else None,
                                  "generate_calls": len(facts.generate_calls)})


@GP506.detector
def mask_excludes_prompt(facts: PromptFacts) -> Iterator[Finding]:
    m = facts.mask
    if m is not None:
        yield GP506.finding("zero_gradient" if facts.zero_grad else None, n_virt=m.virtual_tokens,
                            parameters=facts.prompt_names or facts.attr_names, location=m.location, evidence=m.evidence)


@GP507.detector
def labels_misaligned(facts: PromptFacts) -> Iterator[Finding]:
    lab = facts.labels
    if lab is None:
        return
    if lab.length is not None:
        yield GP507.finding("length", labels_length=lab.length[0], seq=lab.length[1], n_virt=lab.virtual_tokens,
                            parameters=facts.prompt_names, location=lab.location, evidence=lab.evidence)
        return
    yield GP507.finding("slots" if lab.slots is not None else None, n_virt=lab.virtual_tokens, spans=lab.slots,
                        parameters=facts.prompt_names, location=lab.location, evidence=lab.evidence)


@GP509.detector
def cache_in_training(facts: PromptFacts) -> Iterator[Finding]:
    c = facts.cache_call
    if c is not None:
        yield GP509.finding(what="use_cache=True" if c.get("use_cache") is True else "past_key_values",
                            parameters=facts.prompt_names, location=c["location"],
                            evidence={k: c.get(k) for k in ("use_cache", "past_key_values")})


@GP511.detector
def checkpointing_without_input_grad(facts: PromptFacts) -> Iterator[Finding]:
    if facts.checkpoint_warnings:
        yield GP511.finding(parameters=facts.checkpoint_parameters, location=facts.checkpoint_warnings[0],
                            evidence={"warnings": len(facts.checkpoint_warnings)})


@GP504.detector
def prompt_not_in_optimizer(facts: PromptFacts) -> Iterator[Finding]:
    missing = facts.not_in_optimizer
    if missing:
        yield GP504.finding(count=len(missing), names=", ".join(missing), parameters=missing, location=facts.optimizer_site,
                            evidence={"optimizer": facts.optimizer})


@GP503.detector
def base_not_frozen(facts: PromptFacts) -> Iterator[Finding]:
    b = facts.trainable_base
    if b is not None:
        site = b.site
        yield GP503.finding(site.kind if site else None, values=sum(b.by_module.values()), modules=len(b.by_module),
                            where=site.where if site else None, parameters=b.names[:50],
                            location=site.location if site else None, evidence={"by_module": b.by_module})


@GP508.detector
def tied_embedding_trained(facts: PromptFacts) -> Iterator[Finding]:
    t = facts.tied
    if t is not None:
        site = t.site
        yield GP508.finding(site.kind if site else None, name=t.name, where=site.where if site else None,
                            parameters=[t.name], location=site.location if site else None, evidence={"tied": True})


@GP501.detector
def prompt_gets_no_grad(facts: PromptFacts) -> Iterator[Finding]:
    explained = facts.id_casts or facts.loss_from_generate or facts.mask is not None or facts.checkpoint_warnings
    if not facts.no_grad or explained:
        return
    f0 = facts.breaks[0] if facts.breaks else None
    yield GP501.finding("zero" if facts.zero_grad else None, names=", ".join(facts.no_grad), parameters=facts.no_grad,
                        location=f0["location"] if f0 else None,
                        evidence={"break": f0["evidence"] if f0 else None, "related": [f["code"] for f in facts.breaks]})
