"""A graph held on the model across calls of the step: graph-used-after-free (checks/trace/torch_errors.py) before torch
raises it.

After a traced step that ran backward(), a tensor with a grad_fn that a module still holds in an attribute (a recurrent
hidden state, a memory, a running total kept on `self`) reaches the next call's loss with the graph this call's
backward() freed: torch will raise "Trying to backward through the graph a second time" on the next step, which a
single traced step never shows. Only then (healthy models hold no such tensor, so it costs nothing there) the step is
run once more, observed, with the first step's backward() roots and op lines kept; GP119 is reported only when that
second call really raised it, with the tensor carried, where it was made and where the next call used it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.core.step import run_step
from gradprobe.checks.trace.recording import GradTracer
from gradprobe.checks.trace.torch_errors import SECOND_BACKWARD, held_graph_findings
from gradprobe.findings import Finding

MAX_HELD = 64


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value[:MAX_HELD] if isinstance(v, torch.Tensor) for t in [v]]
    if isinstance(value, dict):
        return [v for v in list(value.values())[:MAX_HELD] if isinstance(v, torch.Tensor)]
    return []


def held_graph_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Tensors with a grad_fn that the model's modules hold in plain attributes (not parameters, buffers or submodules),
    with the attribute path where each is held."""
    out: list[tuple[str, torch.Tensor]] = []
    for mname, m in model.named_modules():
        for attr, value in vars(m).items():
            if attr.startswith("_"):  # _parameters, _buffers, _modules, hook dicts
                continue
            out += [(f"{mname}.{attr}" if mname else attr, t) for t in _tensors(value) if t.grad_fn is not None]
    return out


def carried_graph_findings(loaded: Any, tracer: GradTracer) -> list[Finding]:
    """GP119 when the model holds a tensor of the traced step's graph and a second call of the step, observed with the
    first one's backward() roots, raised torch's "backward through the graph a second time"."""
    held = held_graph_tensors(loaded.model)
    if not held or not tracer.backward_calls or tracer.backward_error is not None:
        return []
    again = GradTracer(loaded.model, loaded.user)
    again.backward_calls = [dict(c) for c in tracer.backward_calls]
    again.backward_roots = list(tracer.backward_roots)
    again.grad_fn_loc = dict(tracer.grad_fn_loc)
    step = run_step(loaded, optimizer_step=False, observers=(again,))
    error = again.backward_error
    if step.resource_limit is not None or error is None or SECOND_BACKWARD not in str(error):
        return []
    return held_graph_findings(again, error, {id(t.grad_fn): path for path, t in held})
