"""Precision (GP702, GP708, run by diagnose; GP708 in script mode too): gradients lost to low precision.

    low_precision       parameters held in fp16/bf16, against an fp32 reference step (GP702)
    autocast_underflow  fp32 parameters whose fp16 autocast gradient underflows with no GradScaler (GP708)
"""

from __future__ import annotations

from typing import Any

__all__ = ["precision_findings", "underflow_findings"]


def __getattr__(name: str) -> Any:
    # each module imports on first use: a module of this family imports without loading the rest of it
    if name == "precision_findings":
        from gradprobe.checks.precision import low_precision

        return low_precision.precision_findings
    if name == "underflow_findings":
        from gradprobe.checks.precision import autocast_underflow

        return autocast_underflow.underflow_findings
    raise AttributeError(name)
