"""A `loss_fn` that returns several terms (a dict, a tuple or a list): the total the user's trainer would take, and
which entries are the terms.

The rule follows the trainers that take such returns:
- a dict with a `loss` entry: that entry is the total, the others are logged values (Lightning's `training_step`,
  Hugging Face's model outputs); the total's own graph is then split as any loss is (checks/trace/term_split.py);
- else a dict with keys that contain `loss`: the sum of those entries, the others are logged (mmengine's
  `BaseModel.parse_losses`, mmdet's `loss_cls`/`loss_bbox` beside `acc`);
- else the sum of every entry (detectron2's and torchvision's detection references: `sum(loss_dict.values())`).
Entries summed are scalar tensors. A number (for instance one that `.item()` returned) carries no gradient: it is left
out of the total and kept as an entry, so that the recording can tell a term that `.item()` cut from a logged number;
anything else (a tensor of several elements, a list, None) is left out with a note. gradprobe adds the terms itself,
and the recording (checks/trace/recording.py) takes each entry as a named term of the loss.
"""

from __future__ import annotations

import dis
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

TOTAL_KEY = "loss"
MAX_ENTRIES = 16


@dataclass
class LossParts:
    """What a loss_fn returned as several values: the total, the entries summed into it, the entries left out."""

    form: str  # "dict", "tuple" or "list"
    rule: str  # "loss_entry", "loss_named" or "sum"
    total: torch.Tensor | None = None
    entries: list[tuple[str | int, Any]] = field(default_factory=list)  # (key or index, scalar tensor or number)
    left_out: list[dict[str, Any]] = field(default_factory=list)  # {"entry": key or index, "why": ...}
    source: tuple[str, int, str] | None = None  # the loss_fn's file, the line of its return, its name

    def summary(self) -> dict[str, Any]:
        """The note the report's facts carry (`loss_returned`)."""
        out: dict[str, Any] = {"form": self.form, "rule": _RULES[self.rule],
                               "summed": [k for k, v in self.entries if isinstance(v, torch.Tensor)]}
        left_out = [{"entry": k, "why": _NUMBER} for k, v in self.entries if not isinstance(v, torch.Tensor)]
        if left_out or self.left_out:
            out["left_out"] = left_out + self.left_out
        return out


_NUMBER = "a number, not a tensor: it carries no gradient, so it is not added (a term cut by .item() is GP315)"
_RULES = {"loss_entry": "the `loss` entry is the total; the other entries are logged values",
          "loss_named": "the total is the sum of the entries whose key contains `loss`; the others are logged values",
          "sum": "the total is the sum of the scalar tensor entries"}


def _kind(value: Any) -> str | None:
    """Why an entry is left out of the sum (None: it is summed, or kept as a number)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return f"a tensor of shape {list(value.shape)}, not a scalar"
        if not (value.is_floating_point() or value.is_complex()):
            return f"a {str(value.dtype).removeprefix('torch.')} tensor, not a floating-point loss"
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    return f"a {type(value).__name__}, not a scalar tensor"


def split_returned(returned: Any, loss_fn: Callable[..., Any] | None = None) -> LossParts | None:
    """The terms of what a loss_fn returned (None when it returned anything but a dict, a tuple or a list)."""
    if isinstance(returned, dict):
        items: list[tuple[str | int, Any]] = [(k if isinstance(k, (str, int)) else str(k), v) for k, v in returned.items()]
        form = "dict"
    elif isinstance(returned, (tuple, list)):
        items, form = list(enumerate(returned)), type(returned).__name__ if type(returned) in (tuple, list) else "tuple"
    else:
        return None
    keys = [k for k, _ in items if isinstance(k, str)]
    if form == "dict" and TOTAL_KEY in keys:
        parts = LossParts(form, "loss_entry", total=returned[TOTAL_KEY])
        parts.left_out = [{"entry": k, "why": "logged beside the `loss` entry"} for k, _ in items if k != TOTAL_KEY]
        return parts
    named = form == "dict" and any(TOTAL_KEY in k for k in keys)
    parts = LossParts(form, "loss_named" if named else "sum", source=_return_line(loss_fn))
    for k, v in items:
        if named and not (isinstance(k, str) and TOTAL_KEY in k):
            parts.left_out.append({"entry": k, "why": "logged: its key does not contain `loss`"})
        elif (why := _kind(v)) is not None or len(parts.entries) >= MAX_ENTRIES:
            parts.left_out.append({"entry": k, "why": why or f"more than {MAX_ENTRIES} entries"})
        else:
            parts.entries.append((k, v))
    tensors = [v for _, v in parts.entries if isinstance(v, torch.Tensor)]
    if tensors:
        total = tensors[0]
        for t in tensors[1:]:
            total = _scalar(total) + _scalar(t)
        parts.total = total
        if len(parts.entries) > 1:  # several terms (a number among them may be one that .item() cut)
            _declare(parts)
    return parts


def _scalar(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 0 else t.reshape(())


def _return_line(fn: Callable[..., Any] | None) -> tuple[str, int, str] | None:
    """The loss_fn's file, the line of its one return statement (else of its def), its name."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        returns = [i.offset for i in dis.get_instructions(code) if i.opname.startswith("RETURN")]
        lines = {line for off in returns for start, end, line in code.co_lines() if start <= off < end and line}
    except (TypeError, ValueError, AttributeError):
        lines = set()
    line = lines.pop() if len(lines) == 1 else code.co_firstlineno
    return code.co_filename, int(line), code.co_name


# the last total gradprobe summed itself, so that the recording can take its entries as the loss's terms when
# backward() runs on it (by identity; weakly held: a total dropped before its backward is forgotten)
_declared: tuple[weakref.ref[torch.Tensor], LossParts] | None = None


def _declare(parts: LossParts) -> None:
    global _declared
    assert parts.total is not None
    _declared = (weakref.ref(parts.total, _forget), replace(parts, total=None))


def _forget(ref: weakref.ref[torch.Tensor]) -> None:
    global _declared
    if _declared is not None and _declared[0] is ref:
        _declared = None


def declared(root: torch.Tensor | None) -> LossParts | None:
    """The parts of the total `root` when gradprobe summed it from a loss_fn's entries, else None."""
    if root is None or _declared is None:
        return None
    ref, parts = _declared
    return parts if ref() is root else None
