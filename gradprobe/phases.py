"""The phases of a call, one enum for the parent, the child and the loaders (torch-free, pydantic-free).

The child announces them as progress (sandbox/protocol.py's Progress), the server counts MCP progress by
them, and the parent names the last one when a call ends without a report.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """Where a call is, in order; the child sends them as progress, the parent names the last one on failure."""

    QUEUED = "queued"  # the server's: waiting for a slot in the pool
    STARTING = "starting"
    IMPORTING = "importing"
    BUILDING = "building"
    RUNNING_SCRIPT = "running the script"
    REPLAYING = "replaying the captured step"
    CHECKING = "checking"
    REMOTE = "remote"  # the parent's, for a Ray task whose worker failed before the child said anything

    def __str__(self) -> str:
        return self.value


# the steps the server counts MCP progress by (a phase not listed counts as the last step)
PROGRESS_STEPS: tuple[Phase, ...] = (Phase.QUEUED, Phase.STARTING, Phase.IMPORTING, Phase.BUILDING, Phase.CHECKING)
