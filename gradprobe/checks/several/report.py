"""What a report says of several models: which were trained together (checked as one, their parameters named after
them), and which stood beside them frozen, with what was measured of those."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from gradprobe.checks.steps.observe import norms


def _one(row: dict[str, Any]) -> str:
    return f"{row['name']} ({row['class']}, {row['trainable']} of {row['tensors']} tensors trainable)"


def models_line(rows: list[dict[str, Any]]) -> str | None:
    """One summary line: the models trained together and the frozen ones beside them (None for one model)."""
    trained = [r for r in rows if r["role"] == "trained"]
    frozen = [r for r in rows if r["role"] != "trained"]
    if len(trained) < 2:
        return None
    line = (f"Models: {len(trained)} trained together, checked as one, their parameters named after the script's names "
            f"for them: {', '.join(_one(r) for r in trained)}.")
    if frozen:
        line += " Beside them, frozen by design (in no optimizer, not reached by the loss): " + ", ".join(
            f"{r['name']} ({r['class']}, {r['tensors']} tensors" + (", called under no_grad only" if r.get("no_grad_only")
                                                                     else "") + ")" for r in frozen) + "."
    return line


class FrozenWatch:
    """The frozen models beside the trained ones, measured over the watched steps: each tensor's norm at the first
    step and at the end (one norm per tensor), so that "frozen" is a measurement, not a guess."""

    def __init__(self, members: Iterable[tuple[str, str, bool, list[torch.Tensor]]]) -> None:
        self.rows = [(name, cls, quiet, params, norms(params)) for name, cls, quiet, params in members if params]

    def lines(self, steps: int) -> tuple[list[str], list[dict[str, Any]]]:
        """The all-clear lines, and each model's row (tensors changed: a copy an EMA update writes is not frozen)."""
        out, facts = [], []
        for name, cls, quiet, params, before in self.rows:
            after = norms(params)
            changed = sum(a != b for a, b in zip(after, before, strict=True))
            trainable = sum(p.requires_grad for p in params)
            facts.append({"name": name, "class": cls, "tensors": len(params), "trainable": trainable,
                          "changed_over_steps": changed, "no_grad_only": quiet})
            if changed:
                continue
            how = "used under no_grad only, " if quiet and trainable else ""
            out.append(f"{name} ({cls}, {len(params)} tensors, {trainable} with requires_grad): {how}in no optimizer and "
                       f"not reached by the loss, unchanged over the {steps} steps: frozen beside the trained models")
        return out, facts
