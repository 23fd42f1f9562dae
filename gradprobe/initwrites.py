"""Which writes made each tensor's values while the user's code built the model: an initialiser, or a load.

While the target is built (loading.py's BuildRecorder, and script mode's recorder around the user's script), the
in-place fills that initialisers use (`normal_`, `uniform_` ... through torch.nn.init, `reset_parameters` or a
library's `_init_weights`; `zero_`/`fill_` for constant inits), the factories that make random or constant tensors
(`torch.randn(...)` wrapped in an nn.Parameter), and the copies that loads use (`load_state_dict`'s `param.copy_`,
`set_`) are noted per storage: the last write wins. A parameter whose storage's last write was an initialiser still
holds what its initialiser produced, unless something untracked changed it afterwards (a step: checks compare with the
values at the end of the build). A parameter with no write noted got its values elsewhere: a checkpoint's tensor set
in place (transformers' from_pretrained), a cast, a tensor made from data.

Storages are keyed by identity, verified through a weak reference (PyTorch keeps one Python object per live storage),
so a freed storage whose address is reused is never taken for the one that was noted.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn as nn

from gradprobe.userframes import UserCode

Kind = Literal["random", "constant", "load"]
RANDOM_FILLS = ("normal_", "uniform_", "random_", "bernoulli_", "exponential_", "cauchy_", "log_normal_", "geometric_")
CONSTANT_FILLS = ("zero_", "fill_")
LOADS = ("copy_", "set_")
RANDOM_FACTORIES = ("randn", "rand", "randint", "normal", "randperm", "randn_like", "rand_like", "randint_like")
CONSTANT_FACTORIES = ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "eye")
_INIT_FILE = ("nn/init.py",)  # torch.nn.init's own copies (orthogonal_) are an initialiser's, not a load
MAX_WRITES = 200_000
STATE_DICT_COPY = nn.Module._load_from_state_dict.__code__  # where load_state_dict copies each value in


@dataclass
class Write:
    kind: Kind
    op: str
    seq: int
    location: dict[str, Any] | None  # the user line the write ran under (the innermost user frame), where known


@dataclass
class WriteLog:
    """The last noted write of each storage (id(storage) -> (weak reference, write))."""

    entries: dict[int, tuple[Any, Write]] = field(default_factory=dict)
    seq: int = 0

    def note(self, t: Any, kind: Kind, op: str, location: dict[str, Any] | None) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" or len(self.entries) >= MAX_WRITES:
            return
        try:
            storage = t.untyped_storage()
            ref = weakref.ref(storage)
        except (RuntimeError, TypeError, NotImplementedError):  # a tensor subclass or a sparse tensor: not tracked
            return
        self.seq += 1
        self.entries[id(storage)] = (ref, Write(kind, op, self.seq, location))

    def last(self, t: torch.Tensor) -> Write | None:
        """The last noted write of `t`'s storage, or None (no write noted: values from elsewhere)."""
        try:
            storage = t.untyped_storage()
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        hit = self.entries.get(id(storage))
        return hit[1] if hit is not None and hit[0]() is storage else None


class InitWrites:
    """Context manager that notes initialiser fills, tensor factories and loads into a WriteLog."""

    def __init__(self, user: UserCode, log: WriteLog) -> None:
        self.user, self.log = user, log
        self._saved: list[tuple[Any, str, Any]] = []

    def _where(self) -> dict[str, Any] | None:
        return self.user.innermost(skip=3)

    def _method(self, name: str, kind: Kind) -> Callable[..., Any]:
        orig = getattr(torch.Tensor, name)
        log, where = self.log, self._where

        def wrapped(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = orig(t, *args, **kwargs)
            if torch.compiler.is_compiling():  # inside a graph being compiled: nothing to note, nothing to trace
                return out
            k: Kind = kind
            op = name
            if kind == "load":
                caller = sys._getframe(1).f_code
                if caller.co_filename.replace("\\", "/").endswith(_INIT_FILE):
                    k = "random"  # orthogonal_ copies its random matrix in
                elif caller is STATE_DICT_COPY:
                    op = "load_state_dict"  # a state dict's value put in (load_state_dict, safetensors' load_model)
            log.note(t, k, op, where() if k != "constant" else None)
            return out
        return functools.update_wrapper(wrapped, orig)  # its name: modes that read the op's name see the method's

    def _factory(self, name: str, kind: Kind) -> Callable[..., Any]:
        orig = getattr(torch, name)
        log = self.log

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            if kwargs.get("out") is None and not torch.compiler.is_compiling():
                log.note(out, kind, f"torch.{name}", None)
            return out
        return functools.update_wrapper(wrapped, orig)

    def __enter__(self) -> InitWrites:
        methods: tuple[tuple[tuple[str, ...], Kind], ...] = ((RANDOM_FILLS, "random"), (CONSTANT_FILLS, "constant"),
                                                            (LOADS, "load"))
        factories: tuple[tuple[tuple[str, ...], Kind], ...] = ((RANDOM_FACTORIES, "random"),
                                                              (CONSTANT_FACTORIES, "constant"))
        for names, kind in methods:
            for name in names:
                if hasattr(torch.Tensor, name):
                    self._saved.append((torch.Tensor, name, torch.Tensor.__dict__.get(name)))
                    setattr(torch.Tensor, name, self._method(name, kind))  # type: ignore[arg-type]
        for names, kind in factories:
            for name in names:
                if hasattr(torch, name):
                    self._saved.append((torch, name, getattr(torch, name)))
                    setattr(torch, name, self._factory(name, kind))  # type: ignore[arg-type]
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        for owner, name, orig in reversed(self._saved):
            if orig is None:  # a method TensorBase defines: the C method shows through again
                delattr(owner, name)
            else:
                setattr(owner, name, orig)
        self._saved = []
        return False
