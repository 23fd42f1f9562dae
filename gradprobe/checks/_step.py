"""Running one step of the user's model: the call convention, the default loss, the step.

Shared by every check that needs a forward/backward, so that they all call the
model the same way spec/targets.md says.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn

_PROJECTION_SEED = 1234


def call_model(model: nn.Module, batch: Any) -> Any:
    """Call the model with a batch: tensor, tuple (args), dict (kwargs) or (args, kwargs) pair."""
    if isinstance(batch, dict):
        try:
            sig = inspect.signature(model.forward)
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
    if loss_fn is not None:
        return loss_fn(out, batch)
    return default_loss(out)


def run_step(loaded, *, optimizer_step: bool) -> dict:
    """One step: the user's train_step when there is one, else forward + loss + backward (+ step).

    Returns what happened: {"kind", "output", "loss", "error"}; an exception of the user's
    code is caught and returned, since a failing step is itself a finding.
    """
    model, batch = loaded.model, loaded.batch
    result: dict[str, Any] = {"kind": "train_step" if loaded.train_step else "default", "loss": None, "error": None}
    try:
        if loaded.train_step is not None:
            result["returned"] = loaded.train_step(model, batch, loaded.optimizer)
        else:
            out = call_model(model, batch)
            loss = compute_loss(loaded.loss_fn, out, batch)
            result["loss"] = loss
            if loss is None:
                result["error"] = ValueError("the model returned no floating-point output to build a loss from")
                return result
            if loaded.optimizer is not None:
                loaded.optimizer.zero_grad()
            loss.backward()
            if optimizer_step and loaded.optimizer is not None:
                loaded.optimizer.step()
    except Exception as exc:  # the user's step failed: report, don't crash
        result["error"] = exc
    return result


def param_names(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every qualified name it is reachable under (tie-aware)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def module_of(name: str) -> str:
    return name.rpartition(".")[0] or "(root)"
