"""Phrases the GP3xx messages share: a capped list of names, and a user line as "line N of file.py"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def listed(names: list[str], cap: int, more: bool = True) -> str:
    """The first `cap` names, comma-separated, with "..." when some were left out (unless `more` is False)."""
    return ", ".join(names[:cap]) + ("..." if more and len(names) > cap else "")


def line_of(loc: Mapping[str, Any]) -> str:
    """`line 12 of model.py` for a user location."""
    return f"line {loc['line']} of {str(loc['file']).rsplit('/', 1)[-1]}"


def at_line(loc: Mapping[str, Any] | None) -> str:
    """` at line 12 of model.py`, or nothing for no location."""
    return f" at {line_of(loc)}" if loc else ""
