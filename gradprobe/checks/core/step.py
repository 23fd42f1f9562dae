"""Running one step of the user's model: the call convention, the default loss, the one step runner.

Shared by every check that needs a forward/backward, so that they all call the
model the same way spec/targets.md says and read the same typed StepResult.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from gradprobe.checks.core.loss_parts import LossParts, split_returned
from gradprobe.checks.core.torchcompat import allocation_failure
from gradprobe.flowchart import module_of

__all__ = ["StepResult", "attempt_step", "backward_grads", "call_model",
           "compute_loss", "default_loss", "floating_outputs", "module_of",
           "param_names", "run_step"]

_PROJECTION_SEED = 1234


def call_model(model: nn.Module, batch: Any) -> Any:
    """Call the model with a batch: tensor, tuple (args), dict (kwargs) or (args, kwargs) pair. A dict's keys are those
    the forward of the user's module takes (under a library wrapper: DDP's forward takes any)."""
    if isinstance(batch, dict):
        from gradprobe.wrappers import unwrap_library

        try:
            sig = inspect.signature(unwrap_library(model)[0].forward)
        except (TypeError, ValueError):
            return model(**batch)
        params = sig.parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return model(**batch)
        names = {p.name for p in params}
        return model(**{k: v for k, v in batch.items() if k in names})
    if (
        isinstance(batch, tuple)
        and len(batch) == 2
        and isinstance(batch[0], (tuple, list))
        and isinstance(batch[1], dict)
    ):
        return model(*batch[0], **batch[1])
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def floating_outputs(out: Any) -> list[torch.Tensor]:
    """Every floating-point tensor in a model output (tensors, tuples, dicts, HF ModelOutput)."""
    found: list[torch.Tensor] = []

    def walk(o: Any, depth: int = 0) -> None:
        if depth > 6:
            return
        if isinstance(o, torch.Tensor):
            if o.is_floating_point() or o.is_complex():
                found.append(o)
        elif isinstance(o, dict):  # includes transformers' ModelOutput
            for v in o.values():
                walk(v, depth + 1)
        elif isinstance(o, (tuple, list)):
            for v in o:
                walk(v, depth + 1)

    walk(out)
    return found


def default_loss(out: Any) -> torch.Tensor | None:
    """HF `.loss` when present, else sum(out * r) over every floating output, r fixed and random.

    Never a plain sum(): a sum of softmax outputs is constant and would make every gradient zero.
    """
    hf_loss = getattr(out, "loss", None) if not isinstance(out, torch.Tensor) else None
    if isinstance(hf_loss, torch.Tensor):
        return hf_loss
    gen = torch.Generator().manual_seed(_PROJECTION_SEED)
    total = None
    for o in floating_outputs(out):
        if o.device.type == "meta":
            continue
        r = torch.randn(o.shape, generator=gen, dtype=torch.float32).to(device=o.device, dtype=o.dtype)
        term = (o * r).sum()
        total = term if total is None else total + term
    return total


def compute_loss(loss_fn: Any, out: Any, batch: Any) -> torch.Tensor | None:
    return loss_and_parts(loss_fn, out, batch)[0]


def scalar_loss(loss_fn: Any, out: Any, batch: Any) -> torch.Tensor:
    """The loss of one forward as a 0-d tensor, for a measurement of gradprobe's own (a rerun on copies); raises
    ValueError when there is no scalar loss that requires grad."""
    loss = compute_loss(loss_fn, out, batch)
    if loss is None or loss.numel() != 1 or not loss.requires_grad:
        raise ValueError("no scalar loss that requires grad")
    return loss.reshape(())


def backward_grads(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Each parameter's gradient as `loss.backward()` would accumulate it into `.grad`, without touching `.grad`
    (None where the loss does not reach it).

    `torch.autograd.grad(loss, params)` asks for each parameter's current gradient accumulator; a graph can hold an
    older one for the same tensor, and backward still accumulates into `.grad` through it. A compiled forward that
    assigns `param.data = ...` does that (aot_eager, torch 2.13: the accumulator in the graph is not the parameter's
    any more, so autograd.grad returns None where backward gives the gradient). Here every accumulator the graph
    reaches counts, found by the identity of the tensor it holds."""
    held: dict[int, list[Any]] = {}
    seen: set[int] = set()
    todo = [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor):
            held.setdefault(id(var), []).append(node)
        todo.extend(child for child, _ in node.next_functions)
    edges: list[GradientEdge] = []
    owner: list[int] = []
    for i, p in enumerate(params):
        for edge in [GradientEdge(n, 0) for n in held.get(id(p), [])] or [get_gradient_edge(p)]:
            edges.append(edge)
            owner.append(i)
    got = torch.autograd.grad(loss, edges, allow_unused=True)
    out: list[torch.Tensor | None] = [None] * len(params)
    for i, g in zip(owner, got, strict=True):
        if g is not None:
            prev = out[i]
            out[i] = g if prev is None else prev + g
    return out


def loss_and_parts(loss_fn: Any, out: Any, batch: Any) -> tuple[Any, LossParts | None]:
    """The loss of one forward, and when loss_fn returned a dict, a tuple or a list, its parts: the total is taken as
    the user's trainer would (checks/core/loss_parts.py)."""
    if loss_fn is None:
        return default_loss(out), None
    returned = loss_fn(out, batch)
    parts = split_returned(returned, loss_fn)
    return (returned, None) if parts is None else (parts.total, parts)


@dataclass
class StepResult:
    """What one step did. An exception of the user's code is caught and kept here, since a failing step is itself a finding."""

    kind: Literal["train_step", "default"]
    returned: Any = None  # what the user's train_step returned
    loss: torch.Tensor | None = None  # the default step's loss
    loss_parts: dict[str, Any] | None = None  # loss_fn returned several values: how they were summed (loss_parts.py)
    error: Exception | None = None
    error_location: dict | None = None
    error_traceback: str | None = None
    # the default step found no usable loss (GP310): what, and the measured facts
    loss_problem: str | None = None
    loss_evidence: dict[str, Any] = field(default_factory=dict)
    # anomaly-mode re-run after a failing backward / a non-finite gradient: the forward line behind it
    anomaly_location: dict | None = None
    anomaly_trace: str | None = None
    nonfinite_location: dict | None = None
    nonfinite_anomaly: str | None = None
    # why the step was not run at all (its error is then not the user's step's)
    not_run: str | None = None
    # the step stopped because a memory limit refused an allocation (torchcompat.allocation_failure's facts): a resource
    # limit, not an error of the user's code, and what the step did not finish says nothing about the gradients
    resource_limit: dict[str, Any] | None = None

    @property
    def failed(self) -> bool:
        """The step did not reach a usable backward: it raised, or there was no scalar loss to run it on."""
        return self.error is not None or self.loss_problem is not None


def attempt_step(loaded: Any, result: StepResult, optimizer_step: bool) -> None:
    """One try of the step, writing into result; raises what the user's code raises."""
    model, batch = loaded.model, loaded.batch
    if loaded.train_step is not None:
        result.returned = loaded.train_step(model, batch, loaded.optimizer)
        return
    out = call_model(model, batch)
    loss, parts = loss_and_parts(loaded.loss_fn, out, batch)
    if parts is not None:
        result.loss_parts = parts.summary()
        if not isinstance(loss, torch.Tensor):
            result.loss_problem = (f"loss_fn returned a {parts.form} with no scalar floating-point tensor to take as "
                                   "the loss (see facts.loss_returned).")
            result.loss_evidence = {"loss_returned": result.loss_parts}
            return
    result.loss = loss
    if loss is None:
        result.loss_problem = "The model returned no floating-point output to build a loss from."
        return
    if loss.dim() != 0 and loss.numel() != 1:
        result.loss_problem = f"The loss has shape {list(loss.shape)}, not a scalar: reduce it (loss.mean())."
        result.loss_evidence = {"shape": list(loss.shape)}
        return
    if not loss.requires_grad:
        result.loss_problem = "The loss does not require grad: nothing connects it to the parameters."
        result.loss_evidence = {"requires_grad": False, "grad_fn": None}
    if loaded.optimizer is not None and hasattr(loaded.optimizer, "zero_grad"):
        loaded.optimizer.zero_grad()
    loss.backward()
    if optimizer_step and loaded.optimizer is not None:
        loaded.optimizer.step()


def run_step(loaded: Any, *, optimizer_step: bool, observers: Sequence[AbstractContextManager[Any]] = ()) -> StepResult:
    """The one step runner: the user's train_step when there is one, else forward + loss + backward (+ step),
    with `observers` active (entered in order, left in reverse)."""
    result = StepResult(kind="train_step" if loaded.train_step is not None else "default")
    failed = getattr(loaded, "optimizer_error", None)
    if failed is not None and loaded.train_step is not None and loaded.optimizer is None:
        # the user's step needs the optimizer that make_optimizer failed to build: that failure is the root, not a
        # None optimizer inside train_step
        cause = failed.cause if failed.cause is not None else failed
        result.error = failed
        result.error_location = loaded.user.innermost_of_traceback(cause) if failed.cause is not None else None
        result.error_traceback = loaded.user.trimmed_traceback(cause) if failed.cause is not None else str(failed)
        result.not_run = "make_optimizer failed, so train_step was not run"
        result.resource_limit = allocation_failure(failed.cause)
        return result
    with ExitStack() as stack:
        for obs in observers:
            stack.enter_context(obs)
        try:
            attempt_step(loaded, result, optimizer_step)
        except Exception as exc:  # the user's step failed: report, don't crash
            result.error = exc
            result.error_location = loaded.user.innermost_of_traceback(exc)
            result.error_traceback = loaded.user.trimmed_traceback(exc)
            result.resource_limit = allocation_failure(exc)
    return result


def param_names(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every qualified name it is reachable under (tie-aware)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def tensors_in(args: Any, kwargs: Mapping[str, Any] | None) -> Iterator[torch.Tensor]:
    """The tensors among an op's arguments (and one level into lists and tuples)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                yield a
