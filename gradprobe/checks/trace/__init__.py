"""trace_grad_path (GP3xx, and GP118-GP120 raised by the recording engine): which parameters the loss cannot reach,
where the path breaks in the user's code, and why.

One real step runs under the recording mode; its facts are measured, the rules run over them, the findings ranked.

    engine               the public entry: observed_step, trace_findings, trace_report, trace_grad_path
    recording            the recording mode (GradTracer): every op of the step, with the user's line that ran it
    grad_recorder        the gradients the step brought (post-accumulate hooks on every parameter)
    candidates           what the recording keeps per op (cuts, in-place ops, locations)
    graphwalk            walks of the autograd graph (reach, chains)
    attribution          which recorded cut explains which missing gradient
    gradient_facts       the measured facts of one step (TraceFacts): each parameter's outcome, the cuts, the end
    cut_rules            the GP3xx rules on cuts (detach, no_grad, .data, .item(), ...)
    gradient_rules       the GP3xx rules on gradients (zero, non-finite, ...)
    backward_rules       the step's failure (GP308 backward-failed, GP310 loss-not-differentiable)
    torch_errors         GP118-GP120: torch's own errors, with what torch does not say
    carried_state        tensors the model carries across calls (a graph held from the previous step)
    dataloader_workers   tensors made in DataLoader workers
    dead_ops, zero_ops, zero_expr, zeroing_rules   gradients written or computed as zero, and their rules
    loss_terms, term_split                         a loss of several terms: which term reaches which parameter
"""

from __future__ import annotations

from typing import Any

__all__ = ["trace_grad_path", "trace_report"]


def __getattr__(name: str) -> Any:
    # the engine imports on first use: a module of this family imports without loading the rest of it
    if name in __all__:
        from gradprobe.checks.trace import engine

        return getattr(engine, name)
    raise AttributeError(name)
