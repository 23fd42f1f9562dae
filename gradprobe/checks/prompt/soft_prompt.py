"""Finding the soft prompt, and watching what reaches the base model: the measuring side of the GP5xx checks.

The prompt is found (named by the caller, a PEFT prompt encoder, learned values the user's code placed
into the token sequence during the step (checks/prompt/prompt_use.py: by behaviour, never by name), or the only
trainable part of a mostly frozen model); `BaseObserver` watches the HF base model's forward and
generate() during one real step, so the checks can say what reached the base model (ids or
embeddings, mask, labels, cache) and where the prompt vectors sit in its input sequence.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gradprobe.checks.prompt.prompt_use import PromptUse
from gradprobe.checks.core.torchcompat import untraced
from gradprobe.userframes import UserCode


def _hf_pretrained() -> type | None:
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


PromptSource = Literal["caller", "peft", "used", "embedding", "mostly_frozen", "none"]


@dataclass
class FoundPrompt:
    """What find_prompt picked: parameter names, non-leaf tensor attributes ({"name", "tensor"}), how, and that rule in words."""

    params: list[str]
    attrs: list[dict[str, Any]]
    how: PromptSource
    rule: str  # shown to the user (facts.prompt_rule, the summary)
    as_cache: bool = False  # found by use as the base's key/value cache (prefix tuning by hand): no sequence positions

    @property
    def any(self) -> bool:
        return bool(self.params or self.attrs)


_BY_CALLER = "named by the caller"
_USED = ("learned values (made from the model's own parameters or tensor attributes, not from the batch) that the "
         "user's code placed into the token sequence (or handed the base as its key/value cache) during the step")
_NOTHING = ("nothing found: looked for a PEFT prompt encoder, learned values the user's code placed into the token "
            "sequence during the step (joined to the input ids or their embeddings), and a mostly frozen model")


def _named_by_caller(model: nn.Module, params: dict[str, nn.Parameter], prompt: str) -> FoundPrompt:
    if prompt in params:
        return FoundPrompt([prompt], [], "caller", _BY_CALLER)
    under = [n for n in params if n.startswith(prompt + ".")]
    if under:
        return FoundPrompt(under, [], "caller", _BY_CALLER)
    owner_path, _, attr = prompt.rpartition(".")
    try:
        owner = model.get_submodule(owner_path) if owner_path else model
        value = getattr(owner, attr)
    except AttributeError:
        return FoundPrompt([], [], "none", f"the caller named {prompt!r}, which is no parameter or attribute of the model")
    if isinstance(value, torch.Tensor):
        return FoundPrompt([], [{"name": prompt, "tensor": value}], "caller", _BY_CALLER)
    return FoundPrompt([], [], "none", f"{prompt!r} is a {type(value).__name__}, not a tensor")


def _trainable_part(model: nn.Module, params: dict[str, nn.Parameter]) -> FoundPrompt:
    """No prompt by name: the input embedding trained alone, or the only trainable part of a mostly frozen model."""
    total = sum(p.numel() for p in params.values())
    trainable = [n for n, p in params.items() if p.requires_grad]
    base = find_base(model)
    emb = _input_embedding(base)
    if trainable and isinstance(emb, nn.Module) and len(trainable) < len(params):
        in_emb = {id(p) for p in emb.parameters()}
        if all(id(params[n]) in in_emb for n in trainable):
            return FoundPrompt(trainable, [], "embedding", "the input embedding is the only trainable part of a frozen "
                               "language model (new token embeddings trained as the tuning mechanism)")
    if trainable and total and sum(params[n].numel() for n in trainable) < 0.5 * total:
        return FoundPrompt(trainable, [], "mostly_frozen",
                           "the only trainable parameters of a mostly frozen model (under half of its values)")
    return FoundPrompt([], [], "none", _NOTHING)


def find_prompt(model: nn.Module, prompt: str | None = None, used: PromptUse | None = None) -> FoundPrompt:
    """The prompt's parameter names and tensor attributes, how they were found, and that rule in words.

    Without `used` (no step observed yet) only what needs no step is found: the caller's name, a PEFT prompt
    encoder, the trainable part of a frozen model. With it, the values the step placed into the token sequence."""
    params = dict(model.named_parameters())
    if prompt:
        return _named_by_caller(model, params, prompt)
    if hasattr(model, "peft_config") and hasattr(model, "prompt_encoder"):
        names = [n for n in params if n.startswith("prompt_encoder.")]
        if names:
            return FoundPrompt(names, [], "peft", "PEFT prompt encoder (prompt tuning / prefix tuning / p-tuning)")
    if used is not None:
        placed, attrs = used.prompt_parameters(model), used.prompt_attributes()
        if placed or attrs:
            return FoundPrompt(placed, attrs, "used", _USED, as_cache=used.as_cache(placed))
    return _trainable_part(model, params)


def tunes_a_prompt(model: nn.Module, found: FoundPrompt) -> bool:
    """Whether what was found is prompt tuning, for diagnose: named by the caller, PEFT's, the input embedding of a
    frozen model, or learned values placed into the sequence of a pretrained base or of a mostly frozen model. A
    learned token of a model trained whole from scratch (a class token) is part of the model, not a prompt tuned
    beside a frozen one: the prompt checks (a base left trainable, ...) do not apply to it."""
    if not found.any or found.how in ("none", "mostly_frozen"):
        return False
    if found.how != "used" or find_base(model) is not None:
        return True
    placed = set(found.params)
    rest = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and n not in placed)
    return rest < 0.5 * sum(p.numel() for p in model.parameters())


def may_place_prompt(model: nn.Module, user: UserCode) -> bool:
    """Whether the user's own code could place a prompt before a pretrained base: a base model is there, and parameters
    or tensors lie outside it (a wrapper around the base) or in a module of the user's own classes inside it (a replaced
    embedding). A model made only of library classes (Gemma-3's projector and all) places no prompt of the user's."""
    base = find_base(model)
    if base is None:
        return False
    in_base = {id(p) for p in base.parameters()}
    if any(id(p) not in in_base for p in model.parameters()):
        return True
    for m in model.modules():
        own = any(True for _ in m.parameters(recurse=False)) or any(isinstance(v, torch.Tensor) for v in vars(m).values())
        path = getattr(sys.modules.get(type(m).__module__), "__file__", None)
        if own and isinstance(path, str) and user.is_user_file(path):
            return True
    return False


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

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
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
            if (idx.dim() == 2 and tuple(idx.shape) == tuple(embeds.shape[:2]) and weight.dim() == 2
                    and weight.shape[-1] == embeds.shape[-1]):
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

    def __init__(self, base: nn.Module, user: UserCode) -> None:
        self.base, self.user = base, user
        self.calls: list[dict[str, Any]] = []
        self.generate_calls: list[dict[str, Any]] = []
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

    def _post(self, module: nn.Module, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        if not self._in_generate:
            self._embedding_ops.active = max(0, self._embedding_ops.active - 1)

    def _pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
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

    def __enter__(self) -> BaseObserver:
        self._hook = self.base.register_forward_pre_hook(self._pre, with_kwargs=True)
        self._post_hook = self.base.register_forward_hook(self._post, with_kwargs=True, always_call=True)
        self._embedding_ops.__enter__()
        gen = getattr(self.base, "generate", None)
        self._had_generate = "generate" in vars(self.base)
        if gen is not None:
            obs = self

            def generate(*a: Any, **k: Any) -> Any:
                obs.generate_calls.append({"location": obs.user.innermost(skip=1)})
                obs._in_generate += 1
                try:
                    return gen(*a, **k)
                finally:
                    obs._in_generate -= 1

            self.base.generate = generate  # type: ignore[assignment]  # nn.Module's attributes are typed Tensor | Module
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._embedding_ops.__exit__(None, None, None)
        self._hook.remove()
        self._post_hook.remove()
        if "generate" in vars(self.base) and not self._had_generate:
            del self.base.generate
        return False


def n_virtual(model: nn.Module, prompt_params: dict[str, nn.Parameter], attrs: list[dict[str, Any]],
              emb_weight: torch.Tensor | None) -> int | None:
    """How many virtual tokens the prompt has: PEFT's config, else the prompt's own shape."""
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


def encoder_decoder(base: nn.Module | None) -> bool:
    return bool(getattr(getattr(base, "config", None), "is_encoder_decoder", False))


def occupies_positions(call: dict[str, Any] | None, batch: Any, prompts: list[torch.Tensor], n_virt: int | None) -> bool:
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


def _prompt_found(embeds: Any, prompts: list[torch.Tensor], n_virt: int) -> int | None:
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


def spans(positions: list[int]) -> list[list[int]]:
    """Sorted positions as half-open [start, end) runs: [1, 2, 3, 5, 6] -> [[1, 4], [5, 7]]."""
    out: list[list[int]] = []
    for p in positions:
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


def prompt_start(embeds: Any, prompts: list[torch.Tensor], n_virt: int) -> int:
    """Where the virtual tokens sit in the embedded sequence: found by value when the prompt's rows were
    copied into inputs_embeds (prepended, appended or in the middle), else assumed prepended."""
    found = _prompt_found(embeds, prompts, n_virt)
    return 0 if found is None else found


def peft_type(model: nn.Module) -> str | None:
    cfg = getattr(model, "peft_config", None)
    if isinstance(cfg, dict) and cfg:
        t = getattr(next(iter(cfg.values())), "peft_type", None)
        return getattr(t, "value", str(t)) if t is not None else None
    return None


