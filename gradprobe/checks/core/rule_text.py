"""Phrases the rules' messages share: a capped list of names ("a, b..." or "a, b and 3 more"), and a user line as
"line N of file.py" or "file.py:N"."""

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


def and_more(names: list[str], cap: int) -> str:
    """The first `cap` names, comma-separated, then "and N more" for the rest."""
    return ", ".join(names[:cap]) + (f" and {len(names) - cap} more" if len(names) > cap else "")


def file_line(loc: Mapping[str, Any] | None) -> str:
    """A user line as `file.py:LINE`."""
    return f"{str(loc['file']).rsplit('/', 1)[-1]}:{loc['line']}" if loc else "a line outside the project"
