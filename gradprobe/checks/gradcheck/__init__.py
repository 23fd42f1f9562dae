"""run_gradcheck (GP4xx): every custom autograd.Function the model really calls, checked on the inputs it really gets.

    engine          discovery (one forward with Function.apply watched), then each Function checked once; the public entry
    jacobians       float64 copies of the inputs, full Jacobians both ways
    function_rules  the GP4xx rules
    backward_lines  which line of a Function's backward computes the wrong gradient
    rewrites        intentional rewrites (gradient reversal or scaling, straight-through surrogates): info, not errors
"""

from __future__ import annotations

from typing import Any

__all__ = ["gradcheck_report", "run_gradcheck"]


def __getattr__(name: str) -> Any:
    # the engine imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.gradcheck import engine

        return getattr(engine, name)
    raise AttributeError(name)
