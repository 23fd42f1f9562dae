"""Library wrappers around a user's model: a compiled module (`torch.compile`'s OptimizedModule),
DistributedDataParallel, DataParallel, Lightning Fabric's _FabricModule. The checks run on the wrapped module, so parameter names
come without the wrapper's prefix (`_orig_mod.`, `module.`); the wrapper is kept for the checks
that need it (compiled against eager)."""

from __future__ import annotations

import torch.nn as nn

_INNER = {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module", "DataParallel": "module"}
# Lightning Fabric's module wrapper (`fabric.setup(model)`): the user's module is `_original_module`
_LIBRARY_INNER = {("_FabricModule", "lightning.fabric."): "_original_module",
                  ("_FabricModule", "lightning_fabric."): "_original_module"}


def is_compiled(m: object) -> bool:
    """A torch.compile'd module (checked by type name: torch._dynamo is not imported for it)."""
    return any(k.__name__ == "OptimizedModule" and k.__module__.startswith("torch.") for k in type(m).__mro__)


def _inner(m: nn.Module) -> nn.Module | None:
    for k in type(m).__mro__:
        attr = _INNER.get(k.__name__)
        if attr is None:
            attr = next((a for (name, prefix), a in _LIBRARY_INNER.items()
                         if k.__name__ == name and k.__module__.startswith(prefix)), None)
        elif not k.__module__.startswith("torch."):
            attr = None
        if attr is not None:
            inner = getattr(m, attr, None)
            return inner if isinstance(inner, nn.Module) else None
    return None


def unwrap_library(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """(the innermost user module, the outermost wrapper or None); wrappers may nest (DDP of compiled)."""
    outer, m = None, model
    for _ in range(4):
        inner = _inner(m)
        if inner is None:
            break
        outer, m = (model if outer is None else outer), inner
    return m, outer


def compiled_wrapper(*mods: nn.Module | None) -> nn.Module | None:
    """The first compiled module among `mods` and the wrappers they hold."""
    for m in mods:
        for _ in range(4):
            if m is None:
                break
            if is_compiled(m):
                return m
            m = _inner(m)
    return None



# segments library wrappers insert inside a model's parameter names: FSDP1's per-layer wrappers, activation
# checkpointing's wrapper, a compiled submodule (`module.` is left: it is also an ordinary attribute name)
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def clean_name(name: str) -> str:
    """A parameter name without the segments library wrappers add inside a model (`_fsdp_wrapped_module.`, ...)."""
    parts = name.split(".")
    return ".".join([p for p in parts[:-1] if p not in _WRAPPER_SEGMENTS] + parts[-1:])
