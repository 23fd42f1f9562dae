"""Targets that bring their own step: a LightningModule as `model` (duck-typed on its API).

`"model": "lit.py:LitModel"` gives the module; its `configure_optimizers()` is the optimizer,
a batch of its `train_dataloader()` the inputs, and its `training_step(batch, 0)` the step
(forward and loss), unless the target names its own `inputs`, `optimizer` or `train_step`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


def is_lightning_like(model: nn.Module) -> bool:
    return callable(getattr(model, "training_step", None)) and callable(getattr(model, "configure_optimizers", None))


def first_optimizer(value: Any, depth: int = 0) -> Any:
    """The first torch optimizer in what configure_optimizers returned (an optimizer, a list,
    an ([optimizers], [schedulers]) pair or a dict with "optimizer")."""
    if isinstance(value, torch.optim.Optimizer) or depth > 3:
        return value
    if isinstance(value, dict):
        return first_optimizer(value.get("optimizer"), depth + 1)
    if isinstance(value, (list, tuple)):
        for v in value:
            hit = first_optimizer(v, depth + 1)
            if isinstance(hit, torch.optim.Optimizer):
                return hit
    return value


def step_loss(out: Any) -> torch.Tensor | None:
    """The loss a training_step returned: a tensor, or a dict's "loss"."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor):
        return out["loss"]
    return None


def lightning_train_step(model: nn.Module, batch: Any, optimizer: Any) -> Any:
    if optimizer is not None and hasattr(optimizer, "zero_grad"):
        optimizer.zero_grad()
    out = model.training_step(batch, 0)  # type: ignore[operator]
    loss = step_loss(out)
    if loss is None:
        raise ValueError(f"{type(model).__name__}.training_step returned {type(out).__name__}, "
                         "not a loss tensor or a dict with 'loss'")
    loss.backward()
    if optimizer is not None and hasattr(optimizer, "step"):
        optimizer.step()
    return out


def lightning_defaults(model: nn.Module, found: dict[str, Any]) -> list[str]:
    """Fill the target's missing optimizer, inputs and train_step from a LightningModule; say which."""
    if not is_lightning_like(model):
        return []
    used = []
    if found.get("optimizer") is None:
        found["optimizer"] = lambda m: first_optimizer(m.configure_optimizers())
        used.append("configure_optimizers")
    if found.get("inputs") is None and callable(getattr(model, "train_dataloader", None)):
        def first_batch(m: Any = model) -> Any:
            return next(iter(m.train_dataloader()))
        found["inputs"] = first_batch
        used.append("train_dataloader")
    if found.get("train_step") is None:
        found["train_step"] = lightning_train_step
        used.append("training_step")
    return used


