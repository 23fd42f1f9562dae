"""Comparison 3 for check_equivalence: packed rows against the same examples padded, one per row (GP803).

The comparison itself is the dependencies family's (checks/dependencies/packed_vs_padded.py); this entry measures the
packed rows and the model's causality as check_dependencies does, through that family's engine, and keeps only the
comparison's part.
"""

from __future__ import annotations

from typing import Any

from gradprobe.checks.dependencies.engine import measure
from gradprobe.checks.dependencies.packed_vs_padded import NO_PACKED_ROWS


def run(loaded: Any, options: dict[str, Any]) -> dict[str, Any]:
    """check_equivalence's path: the packed rows found, the model's own call inside a train_step captured and the
    model's causality measured as check_dependencies does (its engine's measure, which then runs this comparison), so
    both tools compare the same batches, pad a causal model the same way and put GP803 at the line of a measured
    packed leak; only this comparison's part is kept."""
    out = measure(loaded, ("causality", "packed", "packed_vs_padded"))
    if out.packing is not None:
        return out.packing
    mine = [e for e in out.not_run if e["check"] == "packed_vs_padded"]
    why = mine[0]["why"] if mine else NO_PACKED_ROWS
    failed = [e for e in mine if e["cause"] != "not_applicable"]  # the probe failed: said, never taken for "no rows"
    return {"applies": False, "why_not": why, "findings": [], "verified": [], "not_run": failed, "facts": {}}
