"""The one test of "is this path inside an allowed root", used by the server, the interpreter search and the child.

Standard library only: the confining code (view.py) runs it in the launcher and the warm worker's children too.
Both sides are compared as given: callers pass real paths (the server resolves symlinks and `..` with realpath, the
confining code reads the path of the directory it opened). `/` is never a root: it would hold the whole machine, so
nothing is inside it (and `gradprobe serve --allow-root /` is refused).
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def inside(path: str, roots: Iterable[str]) -> bool:
    """`path` is one of `roots` or below one (a root given with a trailing slash counts the same; `/` holds nothing)."""
    for root in roots:
        root = root.rstrip("/")
        if root and (path == root or path.startswith(root + "/")):
            return True
    return False


def resolved_inside(path: str, roots: Iterable[str]) -> bool:
    """The same for a path as the caller wrote it: symlinks and `..` resolved first."""
    return inside(os.path.realpath(path), [os.path.realpath(r) for r in roots])
