"""GP5xx: does the soft prompt learn, and only the prompt? For hand-written and PEFT prompt tuning.

The prompt is found (named, PEFT prompt encoder, named like a prompt, or the only
trainable part of a mostly frozen model); one real step runs under the trace
machinery with the base model's forward and generate() observed, so the
findings can say what reached the base model (ids or embeddings, mask, labels,
cache) and where the prompt's path breaks.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gradprobe.checks._step import module_of
from gradprobe.checks.torchcompat import untraced
from gradprobe.findings import Finding, make_finding
from gradprobe.report import make_report

if TYPE_CHECKING:
    from gradprobe.checks.trace import TraceRun

RULES = {
    "GP501": {
        "name": "prompt-gets-no-grad", "severity": "error", "rank": 36, "consequence": True,
        "summary": "The soft prompt's gradient is None or zero after backward.",
        "why": "A prompt without gradient never changes: the run trains nothing.",
        "example": "loss.backward(); print(model.prompt.grad)  # None",
        "fix": "Follow the more precise finding (GP502-GP511) or evidence.break to the line that cuts the prompt's path.",
    },
    "GP502": {
        "name": "prompt-through-input-ids", "severity": "error", "rank": 20,
        "summary": "The prompt was turned into token ids (concatenated to input_ids, cast to long).",
        "why": "An embedding lookup by integer ids has no gradient with respect to the ids: the prompt only selects rows of a frozen table.",
        "example": "input_ids = torch.cat([self.prompt.expand(b, -1), input_ids], 1).long()",
        "fix": "Prepend embeddings, not ids: inputs_embeds = torch.cat([prompt.expand(b, -1, -1), wte(input_ids)], 1); lm(inputs_embeds=inputs_embeds, ...)",
    },
    "GP503": {
        "name": "base-not-frozen", "severity": "warning", "rank": 99,
        "summary": "Base-model parameters are trainable beside the prompt.",
        "why": "Prompt tuning means a frozen base; trainable base weights change the model and cost memory.",
        "example": "forgetting lm.requires_grad_(False)",
        "fix": "Freeze the base: model.lm.requires_grad_(False) (PEFT does this in get_peft_model).",
    },
    "GP504": {
        "name": "prompt-not-in-optimizer", "severity": "error", "rank": 32,
        "summary": "The prompt is not in the optimizer.",
        "why": "It gets a gradient but step() never updates it.",
        "example": "AdamW(model.prompt_encoder.parameters())  # prompt_embeddings left out",
        "fix": "Pass the prompt (all trainable parameters): AdamW([p for p in model.parameters() if p.requires_grad])",
    },
    "GP505": {
        "name": "generate-in-training", "severity": "error", "rank": 21,
        "summary": "The loss is computed from generate(), which runs under no_grad.",
        "why": "generate() is decorated with @torch.no_grad(): its scores carry no history back to the prompt.",
        "example": "scores = lm.generate(inputs_embeds=..., output_scores=True).scores",
        "fix": "Train with a forward pass (teacher forcing): out = lm(inputs_embeds=..., labels=...); out.loss.backward()",
    },
    "GP506": {
        "name": "attention-mask-excludes-prompt", "severity": "error", "rank": 22,
        "summary": "The attention mask gives the prompt positions zero weight.",
        "why": "No position attends to the virtual tokens, so the loss does not depend on them and their gradient is zero.",
        "example": "attention_mask = F.pad(attention_mask, (n_prompt, 0))  # pads with 0",
        "fix": "Extend the mask with ones: attention_mask = F.pad(attention_mask, (n_prompt, 0), value=1)",
    },
    "GP507": {
        "name": "labels-misaligned", "severity": "error", "rank": 24,
        "summary": "Labels do not cover the prompt positions with the ignore index, or their length differs from the embedded sequence.",
        "why": "Shifted or mislabelled positions train the model on the wrong targets, or fail.",
        "example": "labels passed unchanged while inputs_embeds has n_prompt extra positions",
        "fix": "Prepend the ignore index: labels = torch.cat([labels.new_full((b, n_prompt), -100), labels], 1)",
    },
    "GP508": {
        "name": "tied-embedding-trained", "severity": "warning", "rank": 99,
        "summary": "The trainable set includes an input embedding tied to the output head.",
        "why": "Training one trains both: the output distribution moves with the embedding table.",
        "example": "model.transformer.wte.requires_grad_(True) on GPT-2 (lm_head is tied)",
        "fix": "Keep the embedding frozen, or untie the head deliberately.",
    },
    "GP509": {
        "name": "cache-in-training", "severity": "warning", "rank": 99,
        "summary": "use_cache / past_key_values used in the training step.",
        "why": "A cache carried across steps holds stale keys/values from an old graph (or a freed one), and the prompt's positions can be skipped.",
        "example": "out = lm(inputs_embeds=x, past_key_values=past)",
        "fix": "Pass use_cache=False in training and never carry past_key_values across steps.",
    },
    "GP510": {
        "name": "prompt-not-leaf", "severity": "error", "rank": 10,
        "summary": "The prompt is a non-leaf tensor.",
        "why": "nn.Parameter(x).to(...)/.half()/.cuda() returns a copy with history: it is not registered and never gets .grad.",
        "example": "self.prompt = nn.Parameter(torch.randn(8, d)).half()",
        "fix": "Create the tensor with its final dtype/device, then wrap: self.prompt = nn.Parameter(torch.randn(8, d, dtype=torch.float16))",
    },
    "GP511": {
        "name": "checkpointing-without-input-grad", "severity": "error", "rank": 23,
        "summary": "Reentrant gradient checkpointing with inputs that do not require grad.",
        "why": "Reentrant checkpoint returns outputs without history when no input requires grad: nothing inside reaches the trainable parameters.",
        "example": "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True}) with a frozen embedding",
        "fix": "Use use_reentrant=False, or call model.enable_input_require_grads() before training.",
    },
}

PROMPT_NAME = re.compile(r"(prompt|virtual|soft_?(tok|emb)|prefix|learned_emb)", re.I)


def _hf_pretrained():
    tf = sys.modules.get("transformers")
    return getattr(tf, "PreTrainedModel", None) if tf is not None else None


def find_base(model: nn.Module) -> nn.Module | None:
    cls = _hf_pretrained()
    if cls is None:
        return None
    for m in model.modules():
        if isinstance(m, cls):
            return m
    return None


PromptSource = Literal["caller", "peft", "named", "embedding", "mostly_frozen", "none"]


@dataclass
class FoundPrompt:
    """What find_prompt picked: parameter names, non-leaf tensor attributes ({"name", "tensor"}), how, and that rule in words."""

    params: list[str]
    attrs: list[dict[str, Any]]
    how: PromptSource
    rule: str  # shown to the user (facts.prompt_rule, the summary)

    @property
    def any(self) -> bool:
        return bool(self.params or self.attrs)


def find_prompt(model: nn.Module, prompt: str | None = None) -> FoundPrompt:
    """The prompt's parameter names and tensor attributes, how they were found, and that rule in words."""
    params = dict(model.named_parameters())
    if prompt:
        if prompt in params:
            return FoundPrompt([prompt], [], "caller", "named by the caller")
        under = [n for n in params if n.startswith(prompt + ".")]
        if under:
            return FoundPrompt(under, [], "caller", "named by the caller")
        owner_path, _, attr = prompt.rpartition(".")
        try:
            owner = model.get_submodule(owner_path) if owner_path else model
            value = getattr(owner, attr)
        except AttributeError:
            return FoundPrompt([], [], "none", f"the caller named {prompt!r}, which is no parameter or attribute of the model")
        if isinstance(value, torch.Tensor):
            return FoundPrompt([], [{"name": prompt, "tensor": value}], "caller", "named by the caller")
        return FoundPrompt([], [], "none", f"{prompt!r} is a {type(value).__name__}, not a tensor")
    if hasattr(model, "peft_config") and hasattr(model, "prompt_encoder"):
        names = [n for n in params if n.startswith("prompt_encoder.")]
        if names:
            return FoundPrompt(names, [], "peft", "PEFT prompt encoder (prompt tuning / prefix tuning / p-tuning)")
    named = [n for n, p in params.items() if PROMPT_NAME.search(n.rpartition(".")[0] or n) or PROMPT_NAME.search(n)]
    attrs = []
    for mod_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and PROMPT_NAME.search(attr) and value.is_floating_point():
                attrs.append({"name": f"{mod_name}.{attr}" if mod_name else attr, "tensor": value})
    if named or attrs:
        return FoundPrompt(named, attrs, "named", "parameters or tensor attributes named like a prompt (prompt, virtual, soft token/embedding, prefix, learned embedding)")
    total = sum(p.numel() for p in params.values())
    trainable = [n for n, p in params.items() if p.requires_grad]
    base = find_base(model)
    emb = _input_embedding(base)
    if trainable and isinstance(emb, nn.Module) and len(trainable) < len(params):
        in_emb = {id(p) for p in emb.parameters()}
        if all(id(params[n]) in in_emb for n in trainable):
            return FoundPrompt(trainable, [], "embedding", "the input embedding is the only trainable part of a frozen language model "
                               "(new token embeddings trained as the tuning mechanism)")
    if trainable and total and sum(params[n].numel() for n in trainable) < 0.5 * total:
        return FoundPrompt(trainable, [], "mostly_frozen", "the only trainable parameters of a mostly frozen model (under half of its values)")
    return FoundPrompt([], [], "none", "nothing found: looked for a PEFT prompt encoder, parameters/attributes named prompt/virtual/soft token/prefix/learned embedding, and a mostly frozen model")


def _input_embedding(base: nn.Module | None) -> nn.Module | None:
    """The base's input embedding module, where its model class can say (vision models raise NotImplementedError)."""
    get = getattr(base, "get_input_embeddings", None)
    if not callable(get):
        return None
    try:
        emb = get()
    except (NotImplementedError, AttributeError, TypeError):
        return None
    return emb if isinstance(emb, nn.Module) else None


class _EmbeddingOps(TorchFunctionMode):
    """Records the embedding lookups (F.embedding: integer indices, table, inside the base's forward or not) of a step."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0  # > 0 while the base model's forward runs
        self.lookups: list[tuple[torch.Tensor, torch.Tensor, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.embedding and len(self.lookups) < 64:
            idx = args[0] if args else (kwargs or {}).get("input")
            weight = args[1] if len(args) > 1 else (kwargs or {}).get("weight")
            if isinstance(idx, torch.Tensor) and isinstance(weight, torch.Tensor):
                self.lookups.append((idx, weight, self.active > 0))
        return func(*args, **(kwargs or {}))


def _prompt_mask(embeds: torch.Tensor, lookups: list[tuple[torch.Tensor, torch.Tensor, bool]]) -> torch.Tensor | None:
    """[batch, seq] True where inputs_embeds does not hold the token row its own id lookup produced: the positions the
    prompt vectors were written to (prepended, interleaved around the input, or at template slots), found by value."""
    if embeds.dim() != 3:
        return None
    with torch.no_grad(), untraced():
        for idx, weight, _ in lookups:
            if idx.dim() == 2 and tuple(idx.shape) == tuple(embeds.shape[:2]) and weight.dim() == 2 and weight.shape[-1] == embeds.shape[-1]:
                rows = F.embedding(idx, weight.detach()).to(embeds.dtype)
                differ = (rows != embeds.detach()).any(dim=-1)
                # every position changed is no placement but a transform of all rows (scaling, dropout, positions added)
                if bool(differ.any()) and not bool(differ.all(dim=-1).any()):
                    return differ
    return None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except RuntimeError:
        return False


class BaseObserver:
    """Forward pre-hook on the HF base model, a wrapper around generate(), and the embedding lookups of its forward."""

    def __init__(self, base: nn.Module, user):
        self.base, self.user = base, user
        self.calls: list[dict] = []
        self.generate_calls: list[dict] = []
        self._in_generate = 0
        self._embedding_ops = _EmbeddingOps()

    def input_embedding(self) -> torch.Tensor | None:
        """The table the forward looked token ids up in: the lookup whose indices are (a view of) the input_ids the
        base received, else the first lookup of the base's forward. Found by what ran, whatever wraps it."""
        lookups = self._embedding_ops.lookups
        ids = [c["tensors"]["input_ids"] for c in self.calls if "input_ids" in c.get("tensors", {})]
        for idx, weight, _ in lookups:
            if any(idx is t or _same_storage(idx, t) for t in ids):
                return weight
        embeds = [c["tensors"]["inputs_embeds"] for c in self.calls if "inputs_embeds" in c.get("tensors", {})]
        for _idx, weight, in_base in lookups:  # looked up by the user's code, then passed as inputs_embeds
            if not in_base and weight.dim() == 2 and any(weight.shape[-1] == e.shape[-1] for e in embeds):
                return weight
        return next((w for _, w, in_base in lookups if in_base), None)

    def _post(self, module, args, kwargs, out):
        if not self._in_generate:
            self._embedding_ops.active = max(0, self._embedding_ops.active - 1)

    def _pre(self, module, args, kwargs):
        if self._in_generate:
            return
        self._embedding_ops.active += 1
        rec: dict[str, Any] = {"location": self.user.innermost(skip=2), "tensors": {}}
        for key in ("input_ids", "inputs_embeds", "attention_mask", "labels", "past_key_values", "use_cache"):
            v = kwargs.get(key)
            if key == "input_ids" and v is None and args and isinstance(args[0], torch.Tensor):
                v = args[0]
            if isinstance(v, torch.Tensor):
                rec["tensors"][key] = v
                if key == "inputs_embeds":
                    pm = _prompt_mask(v, self._embedding_ops.lookups)
                    if pm is not None:
                        rec["tensors"]["prompt_mask"] = pm
                rec[key] = {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""), "requires_grad": v.requires_grad}
            elif v is not None:
                rec[key] = v if isinstance(v, (bool, int, float, str)) else type(v).__name__
        self.calls.append(rec)

    def __enter__(self):
        self._hook = self.base.register_forward_pre_hook(self._pre, with_kwargs=True)
        self._post_hook = self.base.register_forward_hook(self._post, with_kwargs=True, always_call=True)
        self._embedding_ops.__enter__()
        gen = getattr(self.base, "generate", None)
        self._had_generate = "generate" in vars(self.base)
        if gen is not None:
            obs = self

            def generate(*a, **k):
                obs.generate_calls.append({"location": obs.user.innermost(skip=1)})
                obs._in_generate += 1
                try:
                    return gen(*a, **k)
                finally:
                    obs._in_generate -= 1

            self.base.generate = generate
        return self

    def __exit__(self, *exc):
        self._embedding_ops.__exit__(None, None, None)
        self._hook.remove()
        self._post_hook.remove()
        if "generate" in vars(self.base) and not self._had_generate:
            del self.base.generate
        return False


def _n_virtual(model, prompt_params: dict, attrs: list[dict], emb_weight: torch.Tensor | None) -> int | None:
    cfg = getattr(model, "peft_config", None)
    if isinstance(cfg, dict) and cfg:
        c = next(iter(cfg.values()))
        n = getattr(c, "num_virtual_tokens", None)
        if n:
            return int(n)
    hidden = emb_weight.shape[-1] if emb_weight is not None and emb_weight.dim() == 2 else None
    for t in list(prompt_params.values()) + [a["tensor"] for a in attrs]:
        if t.dim() >= 2 and (hidden is None or t.shape[-1] == hidden):
            return int(t.shape[-2])
        if t.dim() == 1:
            return int(t.shape[0])
    return None


def nonleaf_prompt_findings(loaded, attrs: list[dict]) -> list[Finding]:
    """GP510 for prompt attributes that are not leaves (measured on the built model, no step needed)."""
    findings: list[Finding] = []
    for a in attrs:
        t = a["tensor"]
        if not t.is_leaf:
            findings.append(make_finding(
                "GP510", f"The prompt `{a['name']}` is a non-leaf tensor (made by {type(t.grad_fn).__name__ if t.grad_fn else '?'}): "
                "it is not registered and never gets .grad.",
                parameters=[a["name"]], location=_attr_site(loaded, a["name"]),
                evidence={"shape": list(t.shape), "dtype": str(t.dtype), "grad_fn": type(t.grad_fn).__name__ if t.grad_fn else None},
            ))
    return findings


def prompt_findings(loaded, trace: TraceRun, base_obs: BaseObserver | None, found: FoundPrompt) -> tuple[list[Finding], dict]:
    model = loaded.model
    names_, attrs, rule = found.params, found.attrs, found.rule
    trace_list, trace_facts, tracer, grads = trace.findings, trace.facts, trace.tracer, trace.grads
    params = dict(model.named_parameters())
    prompt_params = {n: params[n] for n in names_}
    findings: list[Finding] = []
    facts: dict[str, Any] = {"prompt_rule": rule}
    prompt_rows = []
    for n, p in prompt_params.items():
        g = grads.got.get(id(p))
        prompt_rows.append({"name": n, "shape": list(p.shape), "dtype": str(p.dtype), "device": str(p.device),
                            "is_leaf": p.is_leaf, "requires_grad": p.requires_grad,
                            "grad": "none" if g is None else ("zero" if g["zero"] else ("nonfinite" if not g["finite"] else "ok")),
                            "grad_norm": None if g is None else g["norm"]})
    facts["prompt"] = prompt_rows
    findings += nonleaf_prompt_findings(loaded, attrs)
    # what reached the base model
    train_calls = base_obs.calls if base_obs else []
    call = train_calls[0] if train_calls else None
    if call:
        facts["base_inputs"] = {k: v for k, v in call.items() if k not in ("tensors",)}
    gens = base_obs.generate_calls if base_obs else []
    if gens:
        facts["generate_calls"] = gens
    # the break on the prompt's path, from the trace
    pnames = set(prompt_params)
    breaks = [f for f in trace_list if f["severity"] == "error" and pnames & set(f["parameters"])]
    by_init = trace_facts.get("zero_by_init") or {}  # a zero gradient a zero-initialised gate explains is by design
    # an embedding table trained as the tuning mechanism gets gradient only in the rows of the ids this batch holds
    # (PEFT trainable tokens): an all-zero gradient there says which ids the batch lacks, not a cut path
    by_design = ("zero",) if found.how == "embedding" else ()
    # a step a memory limit stopped (GP113) left the gradients incomplete: a prompt without one is not a finding then
    no_grad = [r["name"] for r in prompt_rows if r["grad"] in ("none", "zero") and prompt_params[r["name"]].requires_grad
               and r["name"] not in by_init and r["grad"] not in by_design] if trace.step.resource_limit is None else []
    zero_grad = [r["name"] for r in prompt_rows if r["grad"] == "zero" and r["name"] not in by_init]
    explained = False
    emb_weight = base_obs.input_embedding() if base_obs else None
    n_virt = _n_virtual(model, prompt_params, attrs, emb_weight)
    facts["virtual_tokens"] = n_virt
    for f in breaks:
        # measured, not read off the op's name: the prompt's cut produced integers that then selected rows (an id lookup)
        if f["code"] == "GP305" and (f["evidence"].get("used_as_index") or {}).get("op"):
            findings.append(make_finding(
                "GP502", f"The prompt is turned into token ids (`{f['evidence'].get('op')}` on the prompt"
                + (f", then the base model receives input_ids {call['input_ids']['shape']}" if call and "input_ids" in call else "")
                + "): an id lookup has no gradient, so the prompt never learns.",
                parameters=sorted(pnames & set(f["parameters"])), location=f["location"],
                evidence={"break": f["evidence"], "base_inputs": facts.get("base_inputs")},
            ))
            explained = True
    gen_breaks = [f for f in breaks if f["code"] in ("GP303", "GP310")] if gens else []
    if gens and (gen_breaks or (no_grad and not explained)):
        cut = sorted(pnames & {n for f in gen_breaks for n in f["parameters"]})
        findings.append(make_finding(
            "GP505", "The loss is computed from generate(), which runs under no_grad: nothing links it to the prompt.",
            parameters=cut or (sorted(pnames) if gen_breaks else no_grad), location=gens[0]["location"],
            evidence={"break": gen_breaks[0]["evidence"] if gen_breaks else None, "generate_calls": len(gens)},
        ))
        explained = True
    # mask and labels alignment
    align: dict[str, Any] = {}
    peft_prefix = _peft_type(model) in ("PREFIX_TUNING",)
    in_sequence = found.how not in ("mostly_frozen", "embedding")  # adapters and token tables occupy no virtual positions
    if peft_prefix:
        align["note"] = "prefix tuning: the virtual tokens reach the base as past_key_values, not as sequence positions"
    elif found.how == "embedding":
        align["note"] = "the input embedding itself is trained: no virtual positions, no mask/labels alignment to check"
    elif not in_sequence:
        align["note"] = "the trainable parts are adapters, not virtual tokens: no mask/labels alignment to check"
    t = call["tensors"] if call else {}
    seq_t = t.get("inputs_embeds", t.get("input_ids"))
    pm = t.get("prompt_mask")  # where the prompt vectors really are, found by value in inputs_embeds
    prompts = list(prompt_params.values()) + [a["tensor"] for a in attrs]
    positions = pm is not None or _occupies_positions(call, loaded.batch, prompts, n_virt)
    if call and n_virt and not peft_prefix and in_sequence and not positions:
        align["note"] = ("the base model's input sequence is no longer than the user's and holds no prompt row: the prompt "
                         "reaches the base another way (e.g. as a key/value cache), so no mask/labels alignment to check")
    if (call and isinstance(seq_t, torch.Tensor) and seq_t.dim() >= 2 and (n_virt or pm is not None) and not peft_prefix
            and in_sequence and positions):
        seq = seq_t.shape[1]
        if pm is None:
            nv = n_virt or 0
            start = _prompt_start(t.get("inputs_embeds"), prompts, nv)
            pm = torch.zeros(seq_t.shape[:2], dtype=torch.bool)
            pm[:, start:start + nv] = True
            where = "the prompt's values found in inputs_embeds" if start else "the first positions"
        else:
            n_virt = int(pm[0].sum())
            where = "the positions whose embedding is not their token's row"
        spans = _spans(pm[0].nonzero().flatten().tolist())
        align = {"embedded_length": seq, "virtual_tokens": n_virt, "prompt_spans": spans[:32], "prompt_positions_from": where}
        if len(spans) == 1:
            align["prompt_positions"] = spans[0]  # one block [start, end)
        mask = t.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and seq:
            align["mask_length"] = mask.shape[1]
            if mask.shape[1] == seq:
                cols = mask[pm]
                align["mask_on_prompt_positions"] = float(cols.float().mean())
                if bool((cols == 0).all()):
                    loc = tracer.made_at(mask) if tracer else None
                    findings.append(make_finding(
                        "GP506", f"The attention mask passed to the base model is 0 on all {n_virt} prompt positions: nothing attends to the "
                        "virtual tokens, so the loss does not depend on the prompt" + (" (its gradient is exactly zero)." if zero_grad else "."),
                        parameters=sorted(pnames) or [a["name"] for a in attrs], location=loc or call["location"],
                        evidence={"mask_prompt_columns": mask[0][pm[0]].tolist(), "mask_shape": list(mask.shape), "embedded_length": seq},
                    ))
                    explained = True
        labels = t.get("labels")
        if _encoder_decoder(find_base(model)):
            align["note"] = "encoder-decoder base: labels belong to the decoder, the prompt to the encoder's input"
            labels = None
        elif isinstance(labels, torch.Tensor) and tracer is not None and tracer.made_by_library(labels):
            # the wrapping library extended the labels over the prompt itself (CPT trains on its context tokens)
            align["note"] = "the labels over the prompt positions were built by library code, not by the user: by design"
            labels = None
        if isinstance(labels, torch.Tensor) and labels.dim() == 2 and seq:
            align["labels_length"] = labels.shape[1]
            if labels.shape[1] != seq:
                findings.append(make_finding(
                    "GP507", f"labels have length {labels.shape[1]} but the embedded sequence has {seq} positions ({n_virt} of them virtual).",
                    parameters=sorted(pnames), location=(tracer.made_at(labels) if tracer else None) or call["location"],
                    evidence={"labels_length": labels.shape[1], "embedded_length": seq, "virtual_tokens": n_virt}))
            else:
                ignored = bool((labels[pm] == -100).all())
                align["labels_ignore_prompt_positions"] = ignored
                if not ignored:
                    findings.append(make_finding(
                        "GP507", f"labels on the {n_virt} prompt positions are not the ignore index -100: the model is trained to predict tokens at virtual positions.",
                        parameters=sorted(pnames), location=(tracer.made_at(labels) if tracer else None) or call["location"],
                        evidence={"labels_prompt_columns": labels[0][pm[0]].tolist(), "prompt_spans": align["prompt_spans"]},
                        fix=None if bool(pm[:, :n_virt].all()) else
                        f"Set the labels to -100 at the positions the prompt vectors fill (spans {align['prompt_spans']} here), "
                        "e.g. labels = labels.masked_fill(is_prompt_slot, -100), keeping only the positions to predict."))
    facts["alignment"] = align
    # cache in training
    for c in train_calls:
        if (c.get("use_cache") is True or "past_key_values" in c.get("tensors", {}) or
                (c.get("past_key_values") not in (None, "NoneType") and "past_key_values" in c)) and not peft_prefix:
            findings.append(make_finding(
                "GP509", "The training forward passes " + ("use_cache=True" if c.get("use_cache") is True else "past_key_values") + " to the base model.",
                parameters=sorted(pnames), location=c["location"], evidence={k: c.get(k) for k in ("use_cache", "past_key_values")}))
            break
    # checkpointing
    if tracer is not None and tracer.checkpoint_warnings:
        findings += checkpoint_findings(tracer, trace_facts, sorted(pnames))
        explained = True
    # optimizer
    if loaded.optimizer is not None and isinstance(loaded.optimizer, torch.optim.Optimizer):
        in_opt = {id(t) for g in loaded.optimizer.param_groups for t in g["params"]}
        missing = [n for n, p in prompt_params.items() if p.requires_grad and id(p) not in in_opt]
        missing += [a["name"] for a in attrs if a["tensor"].is_leaf and a["tensor"].requires_grad and id(a["tensor"]) not in in_opt]
        if missing:
            site = loaded.record.optimizer_sites.get(id(loaded.optimizer), (None, None))[1] if loaded.record else None
            findings.append(make_finding(
                "GP504", f"{len(missing)} prompt parameter(s) are not in the optimizer: {', '.join(missing)}. They get gradients but never change.",
                parameters=missing, location=site, evidence={"optimizer": type(loaded.optimizer).__name__}))
    # trainable accounting
    ids_prompt = {id(p) for p in prompt_params.values()}
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
    facts["trainable"] = {"prompt_numel": sum(p.numel() for p in prompt_params.values()),
                          "base_trainable_numel": sum(base_trainable.values()), "base_trainable_by_module": base_trainable}
    if base_trainable and (prompt_params or attrs):
        trainable_base = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in ids_prompt
                          and (in_base is None or id(p) in in_base)]
        took = _trainable_site(loaded, [p for _, p in trainable_base], base_module or model)
        findings.append(make_finding(
            "GP503", f"{sum(base_trainable.values()):,} base-model values in {len(base_trainable)} module(s) are trainable beside the prompt"
            + (f" ({took[1].format(where=_where(took[0]))})." if took else "."),
            parameters=[n for n, _ in trainable_base][:50], location=took[0] if took else None,
            evidence={"by_module": base_trainable}))
    base = find_base(model)
    head: Any = base.get_output_embeddings() if base is not None and hasattr(base, "get_output_embeddings") else None  # type: ignore[operator]
    head_weight = getattr(head, "weight", None)
    if isinstance(emb_weight, torch.Tensor) and emb_weight.requires_grad and head_weight is emb_weight:
        ename = next((n for n, p in model.named_parameters() if p is emb_weight), "input embedding")
        took = _trainable_site(loaded, [emb_weight], base if base is not None else model)
        findings.append(make_finding(
            "GP508", f"The input embedding `{ename}` is trainable and tied to the output head: training it moves the output layer too"
            + (f" ({took[1].format(where=_where(took[0]))})." if took else "."),
            parameters=[ename], location=took[0] if took else None, evidence={"tied": True}))
    if no_grad and not explained:
        f0 = breaks[0] if breaks else None
        findings.append(make_finding(
            "GP501", f"The prompt gets {'a zero' if zero_grad else 'no'} gradient: {', '.join(no_grad)}.",
            parameters=no_grad, location=f0["location"] if f0 else None,
            evidence={"break": f0["evidence"] if f0 else None, "related": [f["code"] for f in breaks]}))
    return findings, facts


def _trainable_site(loaded, tensors: list, base: nn.Module) -> tuple[dict, str] | None:
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
            return site, "the optimizer built at {where} takes them"
    frozen = getattr(record, "frozen_sites", None) or {}
    hits = [frozen[id(p)][1] for p in base.parameters() if id(p) in frozen and not p.requires_grad]
    if hits:
        return hits[-1], "the freezing code at {where} leaves them trainable"
    return None


def _where(loc: dict) -> str:
    return f"line {loc['line']} of {loc['file'].rsplit('/', 1)[-1]}"


def checkpoint_findings(tracer, trace_facts: dict, names: list[str] | None = None) -> list[Finding]:
    """GP511 from the warnings reentrant checkpointing emits when no input requires grad."""
    if tracer is None or not tracer.checkpoint_warnings:
        return []
    return [make_finding(
        "GP511", "Reentrant gradient checkpointing ran with no input requiring grad: the checkpointed blocks return outputs without history.",
        parameters=names or [r["name"] for r in trace_facts["per_parameter"] if r["grad"] == "none"],
        location=tracer.checkpoint_warnings[0], evidence={"warnings": len(tracer.checkpoint_warnings)})]


def _encoder_decoder(base) -> bool:
    return bool(getattr(getattr(base, "config", None), "is_encoder_decoder", False))


def _occupies_positions(call: dict | None, batch, prompts: list, n_virt: int | None) -> bool:
    """Whether the virtual tokens sit in the base model's input sequence (measured): its rows are found in
    inputs_embeds by value, or that sequence is longer than the user's input_ids by at least n_virt. A prompt
    that reaches the base as a key/value cache (prefix tuning, cartridges) occupies no position."""
    if not call or not n_virt:
        return False
    t = call["tensors"]
    if _prompt_found(t.get("inputs_embeds"), prompts, n_virt) is not None:
        return True
    seq = t["inputs_embeds"].shape[1] if "inputs_embeds" in t else (t["input_ids"].shape[1] if "input_ids" in t else None)
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    if seq is None or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return True  # nothing to compare with: keep checking, as before
    return seq >= ids.shape[1] + n_virt


def _prompt_found(embeds, prompts: list, n_virt: int) -> int | None:
    """The position of the prompt's rows in inputs_embeds, found by value, or None."""
    if not isinstance(embeds, torch.Tensor) or embeds.dim() != 3:
        return None
    with torch.no_grad(), untraced():
        row0 = embeds[0].detach()
        for p in prompts:
            if not isinstance(p, torch.Tensor) or p.dim() != 2 or p.shape[-1] != row0.shape[-1] or p.shape[0] != n_virt:
                continue
            first = p[0].detach().to(row0.dtype)
            hits = (row0 == first).all(dim=-1).nonzero().flatten().tolist()
            for h in hits:
                if h + n_virt <= row0.shape[0] and torch.equal(row0[h:h + n_virt], p.detach().to(row0.dtype)):
                    return int(h)
    return None


def _spans(positions: list[int]) -> list[list[int]]:
    """Sorted positions as half-open [start, end) runs: [1, 2, 3, 5, 6] -> [[1, 4], [5, 7]]."""
    out: list[list[int]] = []
    for p in positions:
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


def _prompt_start(embeds, prompts: list, n_virt: int) -> int:
    """Where the virtual tokens sit in the embedded sequence: found by value when the prompt's rows were
    copied into inputs_embeds (prepended, appended or in the middle), else assumed prepended."""
    found = _prompt_found(embeds, prompts, n_virt)
    return 0 if found is None else found


def _peft_type(model) -> str | None:
    cfg = getattr(model, "peft_config", None)
    if isinstance(cfg, dict) and cfg:
        t = getattr(next(iter(cfg.values())), "peft_type", None)
        return getattr(t, "value", str(t)) if t is not None else None
    return None


def _attr_site(loaded, path: str):
    owner_path, _, attr = path.rpartition(".")
    try:
        owner = loaded.model.get_submodule(owner_path) if owner_path else loaded.model
    except AttributeError:
        return None
    return loaded.record.site_of(owner, attr) if loaded.record else None


def run_prompt_checks(loaded, prompt: str | None = None):
    """Find the prompt, observe one traced step with the base watched; (findings, facts, trace, found)."""
    from gradprobe.checks.trace import trace_findings

    found = find_prompt(loaded.model, prompt)
    base = find_base(loaded.model)
    obs = BaseObserver(base, loaded.user) if base is not None else None
    if obs is not None:
        with obs:
            trace = trace_findings(loaded, provenance=True)
    else:
        trace = trace_findings(loaded, provenance=True)
    findings, facts = prompt_findings(loaded, trace, obs, found)
    return findings, facts, trace, found


def prompt_report(loaded, prompt: str | None = None) -> dict:
    findings, facts, trace, found = run_prompt_checks(loaded, prompt)
    if not found.any:
        return make_report("verify_prompt_tuning", findings, [f"No soft prompt found ({found.rule}). Name it with `prompt`."], **facts)
    # keep trace findings about the prompt that no GP5xx explains
    shown = {n for f in findings for n in f["parameters"]}
    pn = set(found.params)
    for f in trace.findings:
        if f["severity"] == "error" and pn & set(f["parameters"]) and not (pn & set(f["parameters"])) <= shown:
            findings.append(f)
    rows = facts.get("prompt", [])
    summary = [f"Prompt ({facts['prompt_rule']}): " + ", ".join(f"{r['name']} {r['shape']} grad={r['grad']}" for r in rows)]
    return make_report("verify_prompt_tuning", findings, summary, **facts)


def verify_prompt_tuning(model, batch, loss_fn=None, optimizer=None, train_step=None, prompt=None, project_dir=None) -> dict:
    """Library entry: verify prompt tuning on a live model."""
    from gradprobe.loading import live_target

    return prompt_report(live_target(model, batch, loss_fn, optimizer, train_step, project_dir), prompt)
