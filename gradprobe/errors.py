"""gradprobe's own exceptions: one base, a small tree.

    GradprobeError                 anything gradprobe raises on purpose (never a bug of ours: those are GP000)
    ├── ToolInputError             the caller fixes it by changing the arguments (a bad path, a missing callable,
    │   │                          an interpreter the server does not allow); the MCP face answers it as a tool error
    │   └── TargetRefError         a reference in the target names nothing (no such file, module or attribute)
    └── TargetError                the user's code failed while the target was loaded (`phase` says where,
                                   `cause` is the user's exception); the child reports it as a finding (GP100, ...)

Torch-free and pydantic-free: the child raises and catches these too.
"""

from __future__ import annotations


class GradprobeError(Exception):
    """The base of every exception gradprobe raises on purpose."""


class ToolInputError(GradprobeError, ValueError):
    """A problem the caller fixes by changing the arguments (bad path, missing callable)."""


class TargetRefError(ToolInputError):
    """A reference in the target (a file, a module, an attribute) names nothing."""


class TargetError(GradprobeError):
    """The target cannot be loaded; `phase` says where, `cause` is the user's exception if any."""

    def __init__(self, phase: str, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.phase = phase
        self.cause = cause
