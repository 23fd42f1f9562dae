"""A picture of several training steps: per parameter group, the learning rate as applied, the gradient norm at
optimizer.step() and the update/weight ratio over the steps, as one small dependency-free SVG (and the same numbers
as a compact text table for a terminal).

The input is the plain data audit_training reports (facts.param_groups: one row per optimizer group with a list
per quantity, one value per optimizer step); nothing here imports torch.
"""

from __future__ import annotations

import html
import math
from typing import Any

SERIES = (("lr_as_applied", "lr", "#1565c0"), ("grad_norm_at_step", "grad norm", "#2e7d32"),
          ("update_ratio", "update/weight", "#c62828"))
_W, _PANEL_H, _PANEL_W, _LEFT, _GAP = 760, 90, 220, 150, 20
MAX_GROUPS = 12


ROW_SERIES = ("lr_as_applied", "grad_norm_after_backward", "grad_norm_at_step", "update_norm", "weight_norm",
              "update_ratio")
ROW_COUNTS = ("with_gradient_at_step",)  # per step, a count of the group's tensors (kept, not drawn)
MAX_STEPS, MAX_ROWS = 32, 64  # the most steps a call runs (audit_training/diagnose `steps`), and groups kept in facts


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 31 else 0


def clean_groups(groups: Any, steps: int = MAX_STEPS) -> list[dict[str, Any]]:
    """What the child sent as facts.param_groups, as the server keeps and draws it: at most MAX_ROWS rows, each with
    its optimizer, group and tensor counts as integers and each series cut to the `steps` the call ran, every value a
    finite float or None; anything else is dropped. The child writes its own result, so nothing it sends decides how
    much the server draws or returns."""
    steps = max(1, min(int(steps), MAX_STEPS))
    out: list[dict[str, Any]] = []
    for row in (groups if isinstance(groups, list) else [])[:MAX_ROWS]:
        if not isinstance(row, dict):
            continue
        clean: dict[str, Any] = {k: _int(row.get(k)) for k in ("optimizer", "group", "tensors")}
        for key in ROW_SERIES:
            values = row.get(key)
            if isinstance(values, list):
                clean[key] = _values({key: values[:steps]}, key)
        for key in ROW_COUNTS:
            values = row.get(key)
            if isinstance(values, list):
                clean[key] = [_int(v) for v in values[:steps]]
        out.append(clean)
    return out


def _values(row: dict[str, Any], key: str) -> list[float | None]:
    out: list[float | None] = []
    for v in row.get(key) or []:
        finite = isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e308 and math.isfinite(float(v))
        out.append(float(v) if finite else None)
    return out


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _polyline(values: list[float | None], x0: float, y0: float, color: str) -> list[str]:
    """One panel: the series scaled to its own min..max (a flat series is drawn mid-height)."""
    seen = [v for v in values if v is not None]
    if not seen:
        return [f'<text x="{x0 + _PANEL_W / 2:.0f}" y="{y0 + _PANEL_H / 2:.0f}" text-anchor="middle" fill="#888">'
                "no value</text>"]
    lo, hi = min(seen), max(seen)
    n = len(values)
    points = []
    for i, v in enumerate(values):
        if v is None:
            continue
        x = x0 + (_PANEL_W * i / (n - 1) if n > 1 else _PANEL_W / 2)
        y = y0 + _PANEL_H - 12 - ((v - lo) / (hi - lo) * (_PANEL_H - 30) if hi > lo else (_PANEL_H - 30) / 2)
        points.append((x, y))
    parts = [f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
             + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>']
    parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in points]
    parts.append(f'<text x="{x0}" y="{y0 + _PANEL_H}" font-size="10" fill="#555">min {_fmt(lo)}  max {_fmt(hi)}</text>')
    return parts


def steps_svg(groups: list[dict[str, Any]]) -> str:
    """Per group (one row), three panels: lr as applied, grad norm at step, update/weight ratio, over the steps."""
    groups = groups[:MAX_GROUPS]
    height = 40 + (_PANEL_H + _GAP) * max(1, len(groups))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" font-family="sans-serif" '
             'font-size="12">', '<rect width="100%" height="100%" fill="white"/>']
    for j, (_, label, color) in enumerate(SERIES):
        parts.append(f'<text x="{_LEFT + j * (_PANEL_W + 10) + _PANEL_W / 2:.0f}" y="20" text-anchor="middle" '
                     f'fill="{color}" font-weight="bold">{label}</text>')
    for i, row in enumerate(groups):
        y0 = 30 + i * (_PANEL_H + _GAP)
        steps = len(row.get("lr_as_applied") or [])
        name = f"opt {row.get('optimizer', 0)} group {row.get('group', i)}"
        parts.append(f'<text x="10" y="{y0 + _PANEL_H / 2:.0f}">{html.escape(name)}</text>')
        parts.append(f'<text x="10" y="{y0 + _PANEL_H / 2 + 16:.0f}" font-size="10" fill="#555">'
                     f'{int(row.get("tensors", 0))} tensors, {steps} steps</text>')
        for j, (key, _, color) in enumerate(SERIES):
            x0 = _LEFT + j * (_PANEL_W + 10)
            parts.append(f'<rect x="{x0}" y="{y0}" width="{_PANEL_W}" height="{_PANEL_H - 12}" fill="#fafafa" '
                         'stroke="#ddd"/>')
            parts += _polyline(_values(row, key), x0, y0, color)
    parts.append("</svg>")
    return "\n".join(parts)


def steps_table(groups: list[dict[str, Any]]) -> str:
    """The same numbers as text: one block per group, one line per optimizer step."""
    out = []
    for i, row in enumerate(groups[:MAX_GROUPS]):
        out.append(f"opt {row.get('optimizer', 0)} group {row.get('group', i)} ({row.get('tensors', 0)} tensors)")
        out.append(f"  {'step':>4}  {'lr':>10}  {'grad norm':>10}  {'update/weight':>13}")
        cols = [_values(row, key) for key, _, _ in SERIES]
        for k in range(max((len(c) for c in cols), default=0)):
            lr, grad, ratio = (c[k] if k < len(c) else None for c in cols)
            out.append(f"  {k + 1:>4}  {_fmt(lr):>10}  {_fmt(grad):>10}  {_fmt(ratio):>13}")
    return "\n".join(out)


def overfit_table(terms: dict[str, dict[str, Any]]) -> str:
    """Overfit one batch, per loss term (audit_training's facts.overfit_one_batch.terms): first value, mean of the last
    3, the slope's t statistic, the verdict, and how many of the trainable tensors it reaches did not move."""
    width = max((len(k) for k in terms), default=4)
    out = [f"  {'term':<{width}}  {'first':>10}  {'last':>10}  {'slope t':>8}  {'trend':<9}  not moved"]
    for key, row in terms.items():
        first, last, t = (row.get(k) for k in ("first", "last", "slope_t"))
        stuck = f"{len(row['reached_not_moved'])} of {row['reaches']}" if "reaches" in row else "-"
        out.append(f"  {key:<{width}}  {_num(first):>10}  {_num(last):>10}  {_num(t):>8}  {row.get('trend', '-'):<9}  {stuck}")
    return "\n".join(out)


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else str(v if v is not None else "-")
