"""Patch-and-restore: one `patched()` helper, and the watches the tracer enters during a step.

Each watch is a context manager; the tracer enters them all through one ExitStack,
so they are undone in reverse order even when the step raises.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import torch

from gradprobe.checks.core.torchcompat import multiprocessing_tensor_reducers


@contextlib.contextmanager
def patched(obj: Any, name: Any, new: Any) -> Iterator[Any]:
    """Replace obj.name (or obj[name] for a mapping) by `new` for the block; yields the original."""
    if isinstance(obj, MutableMapping):
        old = obj[name]
        obj[name] = new
        try:
            yield old
        finally:
            obj[name] = old
        return
    own = getattr(obj, "__dict__", {})
    found = getattr(obj, name)
    if name in own:  # restore the object's own entry as it was (a staticmethod stays one)
        saved = own[name]

        def restore() -> None:
            setattr(obj, name, saved)
    else:  # inherited: remove our shadowing entry again

        def restore() -> None:
            delattr(obj, name)
    setattr(obj, name, new)
    try:
        yield found
    finally:
        restore()


def pickle_watch(on_pickle: Callable[[Any], None]) -> contextlib.ExitStack:
    """Tensors pickled for another process: multiprocessing's tensor reducers and Tensor.__reduce_ex__."""
    stack = contextlib.ExitStack()
    reducers = multiprocessing_tensor_reducers()
    for cls, red in list(reducers.items()):
        if isinstance(cls, type) and issubclass(cls, torch.Tensor):
            def watched(t: Any, _red: Any = red) -> Any:
                on_pickle(t)
                return _red(t)
            stack.enter_context(patched(reducers, cls, watched))
    orig_reduce = torch.Tensor.__reduce_ex__

    def reduce_ex(t: Any, proto: Any) -> Any:
        on_pickle(t)
        return orig_reduce(t, proto)

    stack.enter_context(patched(torch.Tensor, "__reduce_ex__", reduce_ex))
    return stack


def from_numpy_watch(on_result: Callable[[torch.Tensor], None]) -> contextlib.AbstractContextManager[Any]:
    """torch.from_numpy: a value that left torch may come back through it (the mode does not see it)."""
    orig = torch.from_numpy

    def from_numpy(arr: Any) -> torch.Tensor:
        out = orig(arr)
        on_result(out)
        return out

    return patched(torch, "from_numpy", from_numpy)


def inference_mode_watch(on_disable: Callable[[Any], None]) -> contextlib.AbstractContextManager[Any]:
    """inference_mode does not go through _set_grad_enabled: note where it is entered (the caller's frame)."""
    orig_enter = torch.inference_mode.__enter__

    def inference_enter(ctx: Any) -> Any:
        if getattr(ctx, "mode", True) and torch.is_grad_enabled():
            on_disable(sys._getframe(1))
        return orig_enter(ctx)

    return patched(torch.inference_mode, "__enter__", inference_enter)


@contextlib.contextmanager
def warning_watch(on_warning: Callable[[str, str, int], None]) -> Iterator[None]:
    """Every warning of the block goes to on_warning(text, filename, lineno) instead of being shown."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            on_warning(str(message), filename, lineno)

        with patched(warnings, "showwarning", show):
            yield


def load_watch(on_load: Callable[[Any], None]) -> contextlib.AbstractContextManager[Any]:
    """torch.load: what was pickled with torch.save comes back here as new leaves (the mode does not see it)."""
    orig = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        on_load(out)
        return out

    return patched(torch, "load", load)


def dataloader_watch(on_iter: Callable[[Any], None]) -> contextlib.AbstractContextManager[Any]:
    """DataLoader.__iter__: which loaders the step iterated (their workers are other processes)."""
    from torch.utils.data import DataLoader

    orig = DataLoader.__iter__

    def iterate(loader: Any) -> Any:
        on_iter(loader)
        return orig(loader)

    return patched(DataLoader, "__iter__", iterate)
