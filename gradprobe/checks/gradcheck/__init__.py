"""run_gradcheck (GP4xx): every custom autograd.Function the model really calls, checked on the inputs it really gets.

    engine          discovery (one forward with Function.apply watched), then each Function checked once; the public entry
    jacobians       float64 copies of the inputs, full Jacobians both ways
    function_rules  the GP4xx rules
    backward_lines  which line of a Function's backward computes the wrong gradient
    rewrites        intentional rewrites (gradient reversal or scaling, straight-through surrogates): info, not errors
"""

from gradprobe.checks.gradcheck.engine import gradcheck_report, run_gradcheck

__all__ = ["gradcheck_report", "run_gradcheck"]
