"""GP5xx: does the soft prompt learn, and only the prompt? For hand-written and PEFT prompt tuning.

The prompt is found (checks/prompt/soft_prompt.py); one real step runs under the trace machinery with the
base model's forward and generate() observed. The engine is three stages: measure what the step
did into `PromptFacts` (what reached the base model: ids or embeddings, mask, labels, cache; where
the prompt's path breaks; the optimizer; what is trainable), run the GP5xx rules
(checks/prompt/prompt_rules.py) over them, and rank (the report orders them).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import call_model, module_of
from gradprobe.checks.prompt.prompt_rules import (
    GP510,
    GP511,
    PROMPT_RULES,
    IdCast,
    LabelsOnPrompt,
    MaskOnPrompt,
    NonLeafPrompt,
    PromptFacts,
    TiedEmbedding,
    TrainableBase,
    TrainableSite,
)
from gradprobe.checks.prompt.prompt_use import PromptUse
from gradprobe.checks.prompt.soft_prompt import (
    BaseObserver,
    FoundPrompt,
    PromptSource,
    encoder_decoder,
    find_base,
    find_prompt,
    may_place_prompt,
    n_virtual,
    occupies_positions,
    peft_type,
    prompt_start,
    spans,
    tunes_a_prompt,
)
from gradprobe.findings import Finding, run_rules
from gradprobe.report import make_report
from gradprobe.verdict import add_not_run, add_verified

if TYPE_CHECKING:
    from gradprobe.checks.trace.engine import TraceRun
    from gradprobe.checks.trace.recording import GradTracer
    from gradprobe.loading import Loaded

__all__ = ["BaseObserver", "FoundPrompt", "PromptSource", "PromptUse", "checkpoint_findings", "find_base", "find_prompt",
           "forward_watched", "may_place_prompt", "nonleaf_prompt_findings", "prompt_findings", "prompt_report",
           "run_prompt_checks", "tunes_a_prompt", "verify_prompt_tuning"]

# TODO(integrator): the trace family's rule objects (GP303, GP305, GP310) once helper trace declares them
_TRACE_ID_CUT = "GP305"
_TRACE_GRAD_OFF = ("GP303", "GP310")


def _attr_site(loaded: Loaded, path: str) -> dict[str, Any] | None:
    owner_path, _, attr = path.rpartition(".")
    try:
        owner = loaded.model.get_submodule(owner_path) if owner_path else loaded.model
    except AttributeError:
        return None
    return loaded.record.site_of(owner, attr) if loaded.record else None


def _nonleaf(loaded: Loaded, attrs: list[dict[str, Any]]) -> list[NonLeafPrompt]:
    """Prompt attributes that are not leaves (measured on the built model, no step needed)."""
    out = []
    for a in attrs:
        t = a["tensor"]
        if not t.is_leaf:
            out.append(NonLeafPrompt(a["name"], type(t.grad_fn).__name__ if t.grad_fn else None, list(t.shape), str(t.dtype),
                                     _attr_site(loaded, a["name"])))
    return out


def nonleaf_prompt_findings(loaded: Loaded, attrs: list[dict[str, Any]]) -> list[Finding]:
    """prompt-not-leaf for prompt attributes that are not leaves (measured on the built model, no step needed)."""
    return run_rules((GP510,), PromptFacts(nonleaf=_nonleaf(loaded, attrs)))


def checkpoint_findings(tracer: GradTracer | None, trace_facts: dict[str, Any], names: list[str] | None = None) -> list[Finding]:
    """checkpointing-without-input-grad from the warnings reentrant checkpointing emits when no input requires grad."""
    if tracer is None or not tracer.checkpoint_warnings:
        return []
    return run_rules((GP511,), PromptFacts(checkpoint_warnings=list(tracer.checkpoint_warnings),
                                           checkpoint_parameters=_checkpoint_parameters(trace_facts, names)))


def _checkpoint_parameters(trace_facts: dict[str, Any], names: list[str] | None) -> list[str]:
    return names or [r["name"] for r in trace_facts["per_parameter"] if r["grad"] == "none"]


@dataclass
class _Step:
    """What the measuring stages share: the loaded target, the traced step, the base model's first training call."""

    loaded: Loaded
    found: FoundPrompt
    prompt_params: dict[str, nn.Parameter]
    tracer: GradTracer | None
    call: dict[str, Any] | None
    info: dict[str, Any]  # the report's facts

    @property
    def prompts(self) -> list[torch.Tensor]:
        return list(self.prompt_params.values()) + [a["tensor"] for a in self.found.attrs]


def _grad_state(g: dict[str, Any] | None) -> str:
    return "none" if g is None else ("zero" if g["zero"] else ("nonfinite" if not g["finite"] else "ok"))


def _prompt_rows(prompt_params: dict[str, nn.Parameter], got: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for n, p in prompt_params.items():
        g = got.get(id(p))
        rows.append({"name": n, "shape": list(p.shape), "dtype": str(p.dtype), "device": str(p.device),
                     "is_leaf": p.is_leaf, "requires_grad": p.requires_grad, "grad": _grad_state(g),
                     "grad_norm": None if g is None else g["norm"]})
    return rows


def _measure_gradients(step: _Step, trace: TraceRun, facts: PromptFacts) -> None:
    """Which prompt parameters got no (or a zero) gradient, and the trace's errors on the prompt's path."""
    rows = _prompt_rows(step.prompt_params, trace.grads.got)
    step.info["prompt"] = rows
    pnames = set(step.prompt_params)
    facts.breaks = [f for f in trace.findings if f["severity"] == "error" and pnames & set(f["parameters"])]
    by_init = trace.facts.get("zero_by_init") or {}  # a zero gradient a zero-initialised gate explains is by design
    # an embedding table trained as the tuning mechanism gets gradient only in the rows of the ids this batch holds
    # (PEFT trainable tokens): an all-zero gradient there says which ids the batch lacks, not a cut path
    by_design = ("zero",) if step.found.how == "embedding" else ()
    # a step a memory limit stopped (resource-limit) left the gradients incomplete: a prompt without one is not a finding then
    if trace.step.resource_limit is None:
        facts.no_grad = [r["name"] for r in rows if r["grad"] in ("none", "zero") and step.prompt_params[r["name"]].requires_grad
                         and r["name"] not in by_init and r["grad"] not in by_design]
    facts.zero_grad = [r["name"] for r in rows if r["grad"] == "zero" and r["name"] not in by_init]


def _measure_base_calls(step: _Step, base_obs: BaseObserver | None, facts: PromptFacts) -> None:
    """What reached the base model, generate() calls, and the cuts that turned the prompt into ids."""
    call = step.call
    if call:
        step.info["base_inputs"] = facts.base_inputs = {k: v for k, v in call.items() if k not in ("tensors",)}
        if "input_ids" in call:
            facts.base_input_ids = call["input_ids"]["shape"]
    facts.generate_calls = base_obs.generate_calls if base_obs else []
    if facts.generate_calls:
        step.info["generate_calls"] = facts.generate_calls
        facts.generate_breaks = [f for f in facts.breaks if f["code"] in _TRACE_GRAD_OFF]
    pnames = set(step.prompt_params)
    for f in facts.breaks:
        # measured, not read off the op's name: the prompt's cut produced integers that then selected rows (an id lookup)
        if f["code"] == _TRACE_ID_CUT and (f["evidence"].get("used_as_index") or {}).get("op"):
            facts.id_casts.append(IdCast(sorted(pnames & set(f["parameters"])), f["evidence"].get("op"), f["location"],
                                         f["evidence"]))


@dataclass
class _Placed:
    """Where the prompt vectors sit in the base model's input sequence."""

    seq: int
    mask: torch.Tensor  # [batch, seq], True on the prompt's positions
    virtual_tokens: int
    align: dict[str, Any]


def _alignment_note(found: FoundPrompt, prefix: bool) -> dict[str, Any]:
    if prefix:
        return {"note": "prefix tuning: the virtual tokens reach the base as past_key_values, not as sequence positions"}
    if found.how == "embedding":
        return {"note": "the input embedding itself is trained: no virtual positions, no mask/labels alignment to check"}
    if found.how == "mostly_frozen":  # adapters and token tables occupy no virtual positions
        return {"note": "the trainable parts are adapters, not virtual tokens: no mask/labels alignment to check"}
    return {}


def _placement(step: _Step, n_virt: int | None) -> tuple[_Placed | None, dict[str, Any]]:
    """The prompt's positions in the base's input (by value where it can), else the alignment note saying why none."""
    prefix = peft_type(step.loaded.model) in ("PREFIX_TUNING",) or step.found.as_cache
    in_sequence = step.found.how not in ("mostly_frozen", "embedding")
    align = _alignment_note(step.found, prefix)
    call = step.call
    t = call["tensors"] if call else {}
    seq_t = t.get("inputs_embeds", t.get("input_ids"))
    pm = t.get("prompt_mask")  # where the prompt vectors really are, found by value in inputs_embeds
    positions = pm is not None or occupies_positions(call, step.loaded.batch, step.prompts, n_virt)
    if call and n_virt and not prefix and in_sequence and not positions:
        align["note"] = ("the base model's input sequence is no longer than the user's and holds no prompt row: the prompt "
                         "reaches the base another way (e.g. as a key/value cache), so no mask/labels alignment to check")
    if not (call and isinstance(seq_t, torch.Tensor) and seq_t.dim() >= 2 and (n_virt or pm is not None) and not prefix
            and in_sequence and positions):
        return None, align
    seq = seq_t.shape[1]
    if pm is None:
        nv = n_virt or 0
        start = prompt_start(t.get("inputs_embeds"), step.prompts, nv)
        pm = torch.zeros(seq_t.shape[:2], dtype=torch.bool)
        pm[:, start:start + nv] = True
        where = "the prompt's values found in inputs_embeds" if start else "the first positions"
    else:
        n_virt = int(pm[0].sum())
        where = "the positions whose embedding is not their token's row"
    runs = spans(pm[0].nonzero().flatten().tolist())
    align = {"embedded_length": seq, "virtual_tokens": n_virt, "prompt_spans": runs[:32], "prompt_positions_from": where}
    if len(runs) == 1:
        align["prompt_positions"] = runs[0]  # one block [start, end)
    return _Placed(seq, pm, n_virt or 0, align), align


def _measure_mask(step: _Step, placed: _Placed) -> MaskOnPrompt | None:
    assert step.call is not None  # placed only from a call
    mask = step.call["tensors"].get("attention_mask")
    seq, pm, align = placed.seq, placed.mask, placed.align
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 2 and seq):
        return None
    align["mask_length"] = mask.shape[1]
    if mask.shape[1] != seq:
        return None
    cols = mask[pm]
    align["mask_on_prompt_positions"] = float(cols.float().mean())
    if not bool((cols == 0).all()):
        return None
    loc = step.tracer.made_at(mask) if step.tracer else None
    return MaskOnPrompt(placed.virtual_tokens, loc or step.call["location"],
                        {"mask_prompt_columns": mask[0][pm[0]].tolist(), "mask_shape": list(mask.shape), "embedded_length": seq})


def _user_labels(step: _Step, align: dict[str, Any]) -> torch.Tensor | None:
    """The labels the base received, where the user made them for the prompt's positions."""
    assert step.call is not None
    labels = step.call["tensors"].get("labels")
    if encoder_decoder(find_base(step.loaded.model)):
        align["note"] = "encoder-decoder base: labels belong to the decoder, the prompt to the encoder's input"
        return None
    if isinstance(labels, torch.Tensor) and step.tracer is not None and step.tracer.made_by_library(labels):
        # the wrapping library extended the labels over the prompt itself (CPT trains on its context tokens)
        align["note"] = "the labels over the prompt positions were built by library code, not by the user: by design"
        return None
    return labels if isinstance(labels, torch.Tensor) else None


def _measure_labels(step: _Step, placed: _Placed) -> LabelsOnPrompt | None:
    assert step.call is not None
    seq, pm, n_virt, align = placed.seq, placed.mask, placed.virtual_tokens, placed.align
    labels = _user_labels(step, align)
    if not (isinstance(labels, torch.Tensor) and labels.dim() == 2 and seq):
        return None
    align["labels_length"] = labels.shape[1]
    loc = (step.tracer.made_at(labels) if step.tracer else None) or step.call["location"]
    if labels.shape[1] != seq:
        return LabelsOnPrompt(n_virt, loc, {"labels_length": labels.shape[1], "embedded_length": seq, "virtual_tokens": n_virt},
                              length=(labels.shape[1], seq))
    ignored = bool((labels[pm] == -100).all())
    align["labels_ignore_prompt_positions"] = ignored
    if ignored:
        return None
    evidence = {"labels_prompt_columns": labels[0][pm[0]].tolist(), "prompt_spans": align["prompt_spans"]}
    return LabelsOnPrompt(n_virt, loc, evidence, slots=None if bool(pm[:, :n_virt].all()) else align["prompt_spans"])


def _measure_alignment(step: _Step, base_obs: BaseObserver | None, facts: PromptFacts) -> None:
    """The attention mask and the labels over the prompt's positions."""
    emb_weight = base_obs.input_embedding() if base_obs else None
    n_virt = n_virtual(step.loaded.model, step.prompt_params, step.found.attrs, emb_weight)
    step.info["virtual_tokens"] = n_virt
    placed, align = _placement(step, n_virt)
    if placed is not None:
        facts.mask = _measure_mask(step, placed)
        facts.labels = _measure_labels(step, placed)
    step.info["alignment"] = align


def _measure_cache(train_calls: list[dict[str, Any]], model: nn.Module, found: FoundPrompt) -> dict[str, Any] | None:
    if peft_type(model) in ("PREFIX_TUNING",) or found.as_cache:  # the prompt itself is the cache
        return None
    for c in train_calls:
        if (c.get("use_cache") is True or "past_key_values" in c.get("tensors", {}) or
                (c.get("past_key_values") not in (None, "NoneType") and "past_key_values" in c)):
            return c
    return None


def _measure_optimizer(step: _Step, facts: PromptFacts) -> None:
    loaded = step.loaded
    if loaded.optimizer is None or not isinstance(loaded.optimizer, torch.optim.Optimizer):
        return
    in_opt = {id(t) for g in loaded.optimizer.param_groups for t in g["params"]}
    missing = [n for n, p in step.prompt_params.items() if p.requires_grad and id(p) not in in_opt]
    missing += [a["name"] for a in step.found.attrs
                if a["tensor"].is_leaf and a["tensor"].requires_grad and id(a["tensor"]) not in in_opt]
    if missing:
        facts.not_in_optimizer = missing
        facts.optimizer = type(loaded.optimizer).__name__
        facts.optimizer_site = loaded.record.optimizer_sites.get(id(loaded.optimizer), (None, None))[1] if loaded.record else None


def _trainable_site(loaded: Loaded, tensors: list[torch.Tensor], base: nn.Module) -> TrainableSite | None:
    """Where trainable base tensors became part of training: the optimizer line that took them, else the
    freezing code that froze the rest of the base but left them trainable."""
    record = getattr(loaded, "record", None)
    if record is None:
        return None
    opt = loaded.optimizer
    if isinstance(opt, torch.optim.Optimizer):
        in_opt = {id(t) for g in opt.param_groups for t in g["params"]}
        site = record.optimizer_sites.get(id(opt), (None, None))[1]
        if site is not None and any(id(t) in in_opt for t in tensors):
            return TrainableSite(site, "optimizer")
    frozen = getattr(record, "frozen_sites", None) or {}
    hits = [frozen[id(p)][1] for p in base.parameters() if id(p) in frozen and not p.requires_grad]
    if hits:
        return TrainableSite(hits[-1], "freezing")
    return None


def _measure_trainable(step: _Step, facts: PromptFacts) -> None:
    """Trainable base-model values beside the prompt."""
    model = step.loaded.model
    ids_prompt = {id(p) for p in step.prompt_params.values()}
    base_module = find_base(model)
    in_base = {id(p) for p in base_module.parameters()} if base_module is not None else None
    seen: set[int] = set()
    base_trainable: dict[str, int] = {}
    for n, p in model.named_parameters():
        if in_base is not None and id(p) not in in_base:
            continue  # prompt encoders and heads around the base are not "the base"
        if p.requires_grad and id(p) not in ids_prompt and id(p) not in seen:
            seen.add(id(p))
            base_trainable[module_of(n)] = base_trainable.get(module_of(n), 0) + p.numel()
    step.info["trainable"] = {"prompt_numel": sum(p.numel() for p in step.prompt_params.values()),
                              "base_trainable_numel": sum(base_trainable.values()), "base_trainable_by_module": base_trainable}
    if base_trainable and step.found.any:
        trainable_base = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in ids_prompt
                          and (in_base is None or id(p) in in_base)]
        site = _trainable_site(step.loaded, [p for _, p in trainable_base], base_module or model)
        facts.trainable_base = TrainableBase(base_trainable, [n for n, _ in trainable_base], site)


def _measure_tied(step: _Step, base_obs: BaseObserver | None, facts: PromptFacts) -> None:
    """An input embedding tied to the output head, trainable, beside a prompt (a full fine-tune trains it by design)."""
    if not step.found.any:
        return
    model = step.loaded.model
    emb_weight = base_obs.input_embedding() if base_obs else None
    base = find_base(model)
    head: Any = base.get_output_embeddings() if base is not None and hasattr(base, "get_output_embeddings") else None  # type: ignore[operator]
    head_weight = getattr(head, "weight", None)
    if head_weight is emb_weight and isinstance(emb_weight, torch.Tensor) and emb_weight.requires_grad:
        ename = next((n for n, p in model.named_parameters() if p is emb_weight), "input embedding")
        facts.tied = TiedEmbedding(ename, _trainable_site(step.loaded, [emb_weight], base if base is not None else model))


def _measure(loaded: Loaded, trace: TraceRun, base_obs: BaseObserver | None, found: FoundPrompt
             ) -> tuple[PromptFacts, dict[str, Any]]:
    """Stage one: everything the GP5xx rules read, and the report's facts."""
    params = dict(loaded.model.named_parameters())
    prompt_params = {n: params[n] for n in found.params}
    train_calls = base_obs.calls if base_obs else []
    tracer = trace.tracer
    step = _Step(loaded, found, prompt_params, tracer, train_calls[0] if train_calls else None, {"prompt_rule": found.rule})
    facts = PromptFacts(prompt_names=sorted(prompt_params), attr_names=[a["name"] for a in found.attrs],
                        nonleaf=_nonleaf(loaded, found.attrs))
    _measure_gradients(step, trace, facts)
    _measure_base_calls(step, base_obs, facts)
    _measure_alignment(step, base_obs, facts)
    facts.cache_call = _measure_cache(train_calls, loaded.model, found)
    if tracer is not None and tracer.checkpoint_warnings:
        facts.checkpoint_warnings = list(tracer.checkpoint_warnings)
        facts.checkpoint_parameters = _checkpoint_parameters(trace.facts, facts.prompt_names)
    _measure_optimizer(step, facts)
    _measure_trainable(step, facts)
    _measure_tied(step, base_obs, facts)
    return facts, step.info


def prompt_findings(loaded: Loaded, trace: TraceRun, base_obs: BaseObserver | None, found: FoundPrompt
                    ) -> tuple[list[Finding], dict[str, Any]]:
    """Measure the step, run the GP5xx rules over it (the report ranks them)."""
    facts, info = _measure(loaded, trace, base_obs, found)
    rows = info.get("prompt") or []
    if trace.step.failed or trace.step.not_run:
        pass  # the step's own failure is its finding (or, on a script, a check that did not run)
    elif found.any and rows:
        fed = sum(1 for r in rows if r.get("grad") == "ok")
        add_verified(info, f"prompt tuning ({found.rule}): {fed} of {len(rows)} prompt tensor(s) got a gradient through "
                           "the base model, the base's inputs and the trainable set checked")
    elif not found.any:  # nothing of prompt tuning was verified: the checks do not apply to what the step does
        add_not_run(info, "the prompt-tuning checks", f"no soft prompt found ({found.rule}); name one with `prompt`",
                    "not_applicable")
    return run_rules(PROMPT_RULES, facts), info


def forward_watched(loaded: Loaded) -> PromptUse:
    """The model's forward alone, without gradient, under the prompt watch: for when the step could not run (the
    optimizer the user's step needs failed to build), so the prompt is still found by what the forward does."""
    use = PromptUse(loaded.model, loaded.user)
    if loaded.batch is None:
        return use
    try:
        with torch.no_grad(), use:
            call_model(loaded.model, loaded.batch)
    except Exception:  # the user's forward failed: the step's own report says so; no prompt is found
        pass
    return use


def run_prompt_checks(loaded: Loaded, prompt: str | None = None) -> tuple[list[Finding], dict[str, Any], TraceRun, FoundPrompt]:
    """Find the prompt, observe one traced step with the base watched; (findings, facts, trace, found)."""
    from gradprobe.checks.trace.engine import trace_findings

    base = find_base(loaded.model)
    obs = BaseObserver(base, loaded.user) if base is not None else None
    use = PromptUse(loaded.model, loaded.user, base)  # the prompt, recognised by what the step does with it
    with contextlib.ExitStack() as stack:
        if obs is not None:
            stack.enter_context(obs)
        stack.enter_context(use)
        trace = trace_findings(loaded, provenance=True)
    if trace.step.not_run:
        use = forward_watched(loaded)
    found = find_prompt(loaded.model, prompt, used=use)
    findings, facts = prompt_findings(loaded, trace, obs, found)
    return findings, facts, trace, found


def prompt_report(loaded: Loaded, prompt: str | None = None) -> dict[str, Any]:
    findings, facts, trace, found = run_prompt_checks(loaded, prompt)
    if not found.any:
        summary = [f"No soft prompt found ({found.rule}). Name it with `prompt`."]
        return make_report("verify_prompt_tuning", findings, summary, **facts)
    # keep trace findings about the prompt that no GP5xx explains
    shown = {n for f in findings for n in f["parameters"]}
    pn = set(found.params)
    for f in trace.findings:
        if f["severity"] == "error" and pn & set(f["parameters"]) and not (pn & set(f["parameters"])) <= shown:
            findings.append(f)
    rows = facts.get("prompt", [])
    summary = [f"Prompt ({facts['prompt_rule']}): " + ", ".join(f"{r['name']} {r['shape']} grad={r['grad']}" for r in rows)]
    return make_report("verify_prompt_tuning", findings, summary, **facts)


def verify_prompt_tuning(model: nn.Module, batch: Any, loss_fn: Any = None, optimizer: Any = None, train_step: Any = None,
                         prompt: str | None = None, project_dir: str | None = None) -> dict[str, Any]:
    """Library entry: verify prompt tuning on a live model."""
    from gradprobe.loading import live_target

    return prompt_report(live_target(model, batch, loss_fn, optimizer, train_step, project_dir), prompt)
