"""inspect_parameters (GP101-GP111, and GP319): is every tensor that should learn registered, a leaf, and trainable?

    engine        measure the model, run the GP1xx rules, merge one finding per user line; the public entry
    module_walk   every module's __dict__ walked for what named_parameters() cannot see
    unregistered  plain tensors and learnable buffers (and what the measured step found of them)
    freeze_rules  GP319: a freezing rule (a name test) that froze more than it names (read by the optimizer too)
"""

from __future__ import annotations

from typing import Any

__all__ = ["inspect_parameters", "inspect_report"]


def __getattr__(name: str) -> Any:
    # the engine imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.registration import engine

        return getattr(engine, name)
    raise AttributeError(name)
