"""The per-tensor, per-step table: each trainable tensor's gradient norm at optimizer.step(), its update norm and its
update/weight ratio, at every observed optimizer step.

Nothing is measured here: the observer (observe.py) already takes one norm per tensor at each step (`ParamStep`: the
gradient at step time in the pre-hook, the update and the weight in the post-hook), and the per-group numbers are their
totals. This module lays them out compactly for the report's facts (the names once, one array per step and quantity,
values rounded to 4 significant digits) and prints a capped text table: the rows that say most first (a tensor with
no gradient or no update at some step, then the update/weight ratios farthest from the median), with how many rows
were left out.
"""

from __future__ import annotations

import math
from typing import Any

from gradprobe.checks.steps.facts import AuditFacts

MAX_TENSORS = 2000  # tensors kept in the facts (the names once); beyond, the first ones and a count
MAX_ROWS = 10  # rows of the text table
MAX_STEP_COLUMNS = 6  # step columns of the text table (the first ones, then the last)


Cell = float | str | None  # a value, "inf"/"nan" for a non-finite one (JSON has no such numbers), None: none


def _r(v: float | None) -> Cell:
    if v is None:
        return None
    return float(f"{v:.4g}") if math.isfinite(v) else str(v)


def _finite(v: Cell) -> bool:
    return isinstance(v, float) and math.isfinite(v)


def per_tensor_steps(facts: AuditFacts) -> dict[str, Any]:
    """{"names": [...], "steps": [...], "optimizer": [...] (several optimizers only), "grad_norm": [[per tensor] per
    step], "update_norm": [...], "update_ratio": [...], "left_out": n}: null where a tensor was not in that step's
    optimizer or had no gradient."""
    order: dict[int, int] = {}
    for s in facts.opt_steps:
        for pid in s.params:
            if pid not in order and facts.requires_grad.get(pid, True) and len(order) < MAX_TENSORS:
                order[pid] = len(order)
    total = len({pid for s in facts.opt_steps for pid in s.params if facts.requires_grad.get(pid, True)})
    optimizers = list(dict.fromkeys(s.optimizer for s in facts.opt_steps))
    grads, updates, ratios = [], [], []
    for s in facts.opt_steps:
        g: list[Cell] = [None] * len(order)
        u: list[Cell] = [None] * len(order)
        r: list[Cell] = [None] * len(order)
        for pid, ps in s.params.items():
            i = order.get(pid)
            if i is None:
                continue
            g[i], u[i] = _r(ps.grad_at_step), _r(ps.update)
            r[i] = _r(ps.update / ps.weight) if ps.update is not None and ps.weight else None
        grads.append(g)
        updates.append(u)
        ratios.append(r)
    out: dict[str, Any] = {"names": [_name(facts, pid, optimizers) for pid in order],
                           "steps": [s.call + 1 for s in facts.opt_steps],
                           "grad_norm": grads, "update_norm": updates, "update_ratio": ratios}
    if len(optimizers) > 1:
        out["optimizer"] = [optimizers.index(s.optimizer) for s in facts.opt_steps]
    if total > len(order):
        out["left_out"] = total - len(order)
    return out


def _name(facts: AuditFacts, pid: int, optimizers: list[int]) -> str:
    """The tensor's name in the model; one in no module the run knows (a script's second model) by its place in the
    optimizer: `optimizer 1, group 0, tensor 2`."""
    if pid in facts.names:
        return facts.names[pid]
    for s in facts.opt_steps:
        for g in s.groups:
            if pid in g.params:
                return f"optimizer {optimizers.index(s.optimizer)}, group {g.index}, tensor {g.params.index(pid)}"
    return facts.name(pid)


def _fmt(v: Cell) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return "0" if v == 0 else f"{v:.2g}"


def _interest(i: int, table: dict[str, Any], median: float) -> tuple[int, float]:
    """Lower is printed first: a step with no gradient or no update (or a non-finite one), then the farthest ratio."""
    grads = [row[i] for row in table["grad_norm"]]
    updates = [row[i] for row in table["update_norm"]]
    ratios = [row[i] for row in table["update_ratio"] if _finite(row[i]) and row[i] > 0]
    bad = any(not _finite(v) or v == 0 for v in grads + updates)
    far = max((abs(math.log10(r / median)) for r in ratios), default=0.0) if median > 0 else 0.0
    return (0 if bad else 1, -far)


def table_lines(table: dict[str, Any], cap: int = MAX_ROWS) -> list[str]:
    """The capped text table: per row a tensor, per column a step, each cell `grad norm / update÷weight`."""
    names, steps = table.get("names") or [], table.get("steps") or []
    if not names or not steps:
        return []
    ratios = sorted(r for row in table["update_ratio"] for r in row if _finite(r) and r > 0)
    median = ratios[len(ratios) // 2] if ratios else 0.0
    rows = sorted(range(len(names)), key=lambda i: _interest(i, table, median))[:cap]
    cols = list(range(len(steps)))
    if len(cols) > MAX_STEP_COLUMNS:
        cols = cols[: MAX_STEP_COLUMNS - 1] + cols[-1:]
    width = min(max(len(names[i]) for i in rows), 48)
    several = "optimizer" in table
    head = [f"step {steps[c]}" + (f"/opt {table['optimizer'][c]}" if several else "") for c in cols]
    lines = [f"Per tensor, each optimizer step (grad norm at step() | update/weight; {len(names)} tensors, "
             f"{len(steps)} steps; facts.per_tensor_steps has every value):",
             "  " + "tensor".ljust(width) + "  " + "  ".join(h.ljust(15) for h in head)]
    for i in rows:
        name = names[i] if len(names[i]) <= width else "…" + names[i][-(width - 1):]
        cells = [f"{_fmt(table['grad_norm'][c][i])} | {_fmt(table['update_ratio'][c][i])}" for c in cols]
        lines.append("  " + name.ljust(width) + "  " + "  ".join(x.ljust(15) for x in cells))
    left = len(names) - len(rows) + int(table.get("left_out") or 0)
    if left or len(cols) < len(steps):
        parts = ([f"{left} more tensor(s)"] if left else []) + (
            [f"steps {steps[cols[-2]] + 1}-{steps[cols[-1]] - 1}"] if len(cols) < len(steps) else [])
        lines.append(f"  ... {' and '.join(parts)} not printed (rows: no gradient or no update first, then the "
                     "update/weight ratios farthest from the median)")
    return lines
