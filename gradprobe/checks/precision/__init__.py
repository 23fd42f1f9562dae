"""Precision (GP702, GP708, run by diagnose; GP708 in script mode too): gradients lost to low precision.

    low_precision       parameters held in fp16/bf16, against an fp32 reference step (GP702)
    autocast_underflow  fp32 parameters whose fp16 autocast gradient underflows with no GradScaler (GP708)
"""

from gradprobe.checks.precision.autocast_underflow import underflow_findings
from gradprobe.checks.precision.low_precision import precision_findings

__all__ = ["precision_findings", "underflow_findings"]
