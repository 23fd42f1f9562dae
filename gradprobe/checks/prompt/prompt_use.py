"""A soft prompt recognised by what the step does with it, never by its name.

A soft prompt is a learned value the user's code places into the token sequence the model consumes:
a tensor made from the model's own state alone (parameters, buffers, tensor attributes and
constants, never the batch) that one op of the user's code puts beside the token ids or their
embeddings (`torch.cat`/`stack` along the sequence, a slice assignment, a masked scatter). `PromptUse`
watches one real step as a TorchFunctionMode and follows values by tensor identity:

- *learned*: made only from model state (and constants): which parameters or attributes it carries;
- *tokens*: made from the batch's integer ids by an embedding lookup, and what is computed from that.

A value computed from the batch (an image projected by a multimodal projector, then written into the
embeddings: Gemma-3's `mm_soft_emb_norm`) is no prompt, whatever its name; nor is a learned token
that library code itself adds (a Q-Former's query tokens): the user's own line must place it.
The prompt's gradient may be cut (a `.detach()`, a cast to ids): it is still found, by what was done.
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gradprobe.checks.core.step import tensors_in
from gradprobe.checks.trace.candidates import outputs
from gradprobe.userframes import UserCode, is_gradprobe_file

# ops that put values into a sequence: joined to it, or written into its positions
_JOIN_OPS = frozenset({"cat", "concat", "concatenate", "stack", "hstack"})
_WRITE_OPS = frozenset({"__setitem__", "masked_scatter", "masked_scatter_", "index_put", "index_put_", "index_copy",
                        "index_copy_", "scatter", "scatter_", "where"})
# torch's Python wrappers between the user's line and the mode (F.* and Tensor methods defined in Python)
_TORCH_WRAPPERS = ("torch/overrides.py", "torch/nn/functional.py", "torch/functional.py", "torch/_tensor.py")
_MAX_PLACEMENTS = 64
_MODULE_CALL = "torch/nn/modules/module.py"
_CACHE_KWARGS = ("past_key_values", "cache")


def _cache_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors of a key/value cache: nested tuples of tensors, or a Cache object's layers' keys and values."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 3 or value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _cache_tensors(v, depth + 1)]
    layers = getattr(value, "layers", None)
    if isinstance(layers, (list, tuple)):
        return [t for layer in layers for a in ("keys", "values") for t in _cache_tensors(getattr(layer, a, None), depth + 1)]
    return []


def _tensor_attributes(model: nn.Module) -> dict[str, torch.Tensor]:
    """Float tensor attributes of the modules that are neither parameters nor buffers (a prompt kept as a plain tensor)."""
    out: dict[str, torch.Tensor] = {}
    for mod_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.is_floating_point():
                out[f"{mod_name}.{attr}" if mod_name else attr] = value
    return out


class PromptUse(TorchFunctionMode):
    """Which learned values the user's code placed into the token sequence during one step, with the line."""

    def __init__(self, model: nn.Module, user: UserCode, base: nn.Module | None = None) -> None:
        super().__init__()
        self.user = user
        self.base = base  # the pretrained base: learned keys/values the user hands it as its cache are a prefix
        self._hook: Any = None
        self._learned: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._names: dict[int, frozenset[str]] = {}
        self._tokens: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self.attributes = _tensor_attributes(model)
        for name, p in model.named_parameters():
            self._mark_learned(p, frozenset({name}))
        for b in model.buffers():
            self._mark_learned(b, frozenset())
        for path, t in self.attributes.items():
            self._mark_learned(t, frozenset({path}))
        # parameter or attribute name -> where the user's code placed it into the sequence (op, location)
        self.placed: dict[str, dict[str, Any]] = {}

    # ---- what a tensor is --------------------------------------------------------------------
    def _mark_learned(self, t: torch.Tensor, names: frozenset[str]) -> None:
        self._learned[id(t)] = t
        self._names[id(t)] = names

    def learned(self, t: torch.Tensor) -> frozenset[str] | None:
        """The parameters/attributes a value made from model state alone carries; None for a value from the batch."""
        hit = self._learned.get(id(t))
        return self._names.get(id(t)) if hit is t else None

    def _token_like(self, t: torch.Tensor) -> bool:
        """Token ids from the batch, or what their embedding lookup produced (and was computed from it)."""
        if self._tokens.get(id(t)) is t:
            return True
        return (not t.is_floating_point() and not t.is_complex() and t.dtype is not torch.bool and t.dim() >= 1
                and self.learned(t) is None)

    # ---- the base's cache: prefix tuning by hand -----------------------------------------------
    def __enter__(self) -> PromptUse:
        if self.base is not None:
            self._hook = self.base.register_forward_pre_hook(self._base_call, with_kwargs=True)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _base_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Learned keys/values the user's code passes the base as its cache (`past_key_values`): a prefix."""
        f: FrameType | None = sys._getframe(1)
        while f is not None and (f.f_code.co_filename.endswith(_MODULE_CALL) or is_gradprobe_file(f.f_code.co_filename)):
            f = f.f_back
        if f is None or not self.user.is_user_file(f.f_code.co_filename):
            return
        loc = self.user.location_of(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        for key in _CACHE_KWARGS:
            names = frozenset().union(*(self.learned(t) or frozenset() for t in _cache_tensors(kwargs.get(key))))
            for n in sorted(names):
                if len(self.placed) < _MAX_PLACEMENTS:
                    self.placed.setdefault(n, {"op": key, "location": loc})

    def as_cache(self, names: list[str]) -> bool:
        """Whether these prompt parameters reached the base as its key/value cache (prefix tuning)."""
        return bool(names) and all(self.placed.get(n, {}).get("op") in _CACHE_KWARGS for n in names)

    # ---- the mode -----------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            name = getattr(getattr(func, "__self__", None), "__name__", "")
        ins = list(tensors_in(args, kwargs))
        if ins and (name in _JOIN_OPS or name in _WRITE_OPS) and len(self.placed) < _MAX_PLACEMENTS:
            self._placement(name, ins, args, kwargs)
        out = func(*args, **kwargs)
        if name == "__setitem__" and len(args) > 2 and isinstance(args[0], torch.Tensor):
            self._written(args[0], args[2])
        else:
            self._follow(func, ins, args, out)
        return out

    def _written(self, target: torch.Tensor, value: Any) -> None:
        """`target[...] = value`: the buffer now holds what was written (a sequence assembled slot by slot)."""
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return
        mine, theirs = self.learned(target), self.learned(value)
        if mine is not None and theirs is not None:
            self._mark_learned(target, mine | theirs)
        elif self._token_like(value) and value.is_floating_point():
            self._learned.pop(id(target), None)
            self._tokens[id(target)] = target
        elif mine is not None:
            self._learned.pop(id(target), None)  # data written into it: no longer made from model state alone

    def _follow(self, func: Any, ins: list[torch.Tensor], args: Any, out: Any) -> None:
        """What the op's outputs are: learned (from model state alone), tokens, or neither."""
        outs = outputs(out)
        if not outs:
            return
        names: frozenset[str] = frozenset()
        from_state, token = True, False
        for t in ins:
            n = self.learned(t)
            if n is not None:
                names |= n
            elif t.dim() > 0:  # a 0-dim tensor is a number, not data
                from_state = False
                token = token or self._tokens.get(id(t)) is t
        if func is F.embedding and args and isinstance(args[0], torch.Tensor) and self.learned(args[0]) is None:
            token, from_state = True, False  # the batch's ids looked up in a table: the token sequence
        for o in outs:
            if from_state:
                self._mark_learned(o, names)
            elif token:
                self._tokens[id(o)] = o

    def _placement(self, name: str, ins: list[torch.Tensor], args: Any, kwargs: dict[str, Any]) -> None:
        """An op that joins learned values to the token sequence, or writes them into it, on the user's line."""
        tokens = [t for t in ins if self._token_like(t)]
        learned = [(t, self.learned(t)) for t in ins if not self._token_like(t)]
        names = frozenset().union(*(n for t, n in learned if n and t.dim() > 0))
        if not tokens or not names or not self._along_sequence(name, tokens, args, kwargs):
            return
        frame = self._caller()
        if frame is None or not self.user.is_user_file(frame.f_code.co_filename):
            return  # library code joins its own learned tokens (query tokens, registers): the user placed no prompt
        loc = self.user.location_of(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        for n in sorted(names):
            self.placed.setdefault(n, {"op": name, "location": loc})

    @staticmethod
    def _along_sequence(name: str, tokens: list[torch.Tensor], args: Any, kwargs: dict[str, Any]) -> bool:
        """A join of embeddings along their feature axis (the last) adds features, not positions."""
        if name not in _JOIN_OPS or name == "stack":
            return True
        dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else 0)
        emb = [t for t in tokens if t.is_floating_point() and t.dim() >= 3]
        return not emb or dim % emb[0].dim() != emb[0].dim() - 1

    @staticmethod
    def _caller() -> FrameType | None:
        """The first frame above the mode that is neither gradprobe's (other modes) nor torch's Python wrappers."""
        f: FrameType | None = sys._getframe(3)
        while f is not None and (is_gradprobe_file(f.f_code.co_filename)
                                 or f.f_code.co_filename.endswith(_TORCH_WRAPPERS)):
            f = f.f_back
        return f

    # ---- what was found -----------------------------------------------------------------------
    def prompt_parameters(self, model: nn.Module) -> list[str]:
        """The parameters the user's code placed into the token sequence, in the model's order."""
        return [n for n, _ in model.named_parameters() if n in self.placed]

    def prompt_attributes(self) -> list[dict[str, Any]]:
        """The tensor attributes (no parameters) placed into the token sequence: {"name", "tensor"}."""
        return [{"name": path, "tensor": t} for path, t in self.attributes.items() if path in self.placed]
