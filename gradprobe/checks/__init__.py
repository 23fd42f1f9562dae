"""The diagnostic library: plain functions on live objects (model, batch, loss, optimizer).

Works wherever the model lives (the sandboxed child, a notebook, pytest):

    from gradprobe.checks import trace_grad_path
    report = trace_grad_path(model, batch, loss_fn=my_loss)

Every function returns a report dict: tool, ok, findings (errors first), summary, facts.
"""

from __future__ import annotations

from typing import Any

from gradprobe.checks.registration.engine import inspect_parameters
from gradprobe.tools import run_tool

__all__ = [
    "inspect_parameters",
    "check_optimizer_coverage",
    "trace_grad_path",
    "run_gradcheck",
    "verify_prompt_tuning",
    "diagnose",
    "check_dependencies",
    "run_tool",
]


def __getattr__(name: str) -> Any:
    fn: Any
    # the heavier checks import on first use, so `inspect_parameters` stays cheap
    if name == "check_optimizer_coverage":
        from gradprobe.checks.optimizer.engine import check_optimizer_coverage as fn
    elif name == "trace_grad_path":
        from gradprobe.checks.trace.engine import trace_grad_path as fn
    elif name == "run_gradcheck":
        from gradprobe.checks.gradcheck.engine import run_gradcheck as fn
    elif name == "verify_prompt_tuning":
        from gradprobe.checks.prompt.engine import verify_prompt_tuning as fn
    elif name == "diagnose":
        from gradprobe.checks.diagnosis import diagnose as fn
    elif name == "check_dependencies":
        from gradprobe.checks.dependencies import check_dependencies as fn
    else:
        raise AttributeError(name)
    return fn


