"""Which frames are the user's, and how to point at one of their lines.

Findings name the user's own `file:line`, never a line inside torch or
transformers. A frame is the user's when its file lies under the project
directory (and not in an installed package) or is inline `setup` source.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
import traceback
from types import FrameType, TracebackType

SETUP_FILENAME = "<gradprobe-setup>"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_DEMO_DIR = os.path.join(_PACKAGE_DIR, "demo") + os.sep  # the bundled broken model is user code


def location(filename: str, line: int, function: str) -> dict:
    """A finding's location: file, line, function and the source text of that line. A line inside a statement
    spread over several lines names the statement's first line (`x = f(\n ...\n).detach()` is one statement)."""
    line = statement_start(filename, int(line))
    return {"file": filename, "line": line, "function": function, "code": linecache.getline(filename, line).strip()}


_STARTS: dict[str, dict[int, int]] = {}


def statement_start(filename: str, line: int) -> int:
    """The first line of the simple statement (or compound statement's header) that spans `line`."""
    table = _STARTS.get(filename)
    if table is None:
        table = _STARTS[filename] = _statement_starts(filename) if len(_STARTS) < 2000 else {}
    return table.get(line, line)


_DEFS: dict[str, list[tuple[int, int]]] = {}


def enclosing_def(filename: str, line: int) -> int | None:
    """The first line of the innermost function definition whose body holds `line` (None at module level)."""
    spans = _DEFS.get(filename)
    if spans is None:
        spans = []
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node.end_lineno is not None:
                spans.append((node.lineno, node.end_lineno))
        if len(_DEFS) < 2000:
            _DEFS[filename] = spans
    inside = [(a, b) for a, b in spans if a <= line <= b]
    return max(inside)[0] if inside else None


def _statement_starts(filename: str) -> dict[int, int]:
    lines = linecache.getlines(filename)
    if not lines:
        return {}
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return {}
    out: dict[int, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node.end_lineno is None or node.end_lineno == node.lineno:
            continue
        body = getattr(node, "body", None)
        # a compound statement owns only its header lines; its body's statements own theirs
        end = body[0].lineno - 1 if isinstance(body, list) and body and isinstance(body[0], ast.stmt) else node.end_lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.decorator_list:
            continue  # decorators and def lines: leave as they are
        for ln in range(node.lineno + 1, end + 1):
            out[ln] = node.lineno
    return out


class UserCode:
    """Decides, with a cache, whether a code file belongs to the user's project."""

    def __init__(self, project_dir: str | None):
        self.root = os.path.realpath(project_dir) + os.sep if project_dir else None
        self._cache: dict[str, bool] = {}

    def is_user_file(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = self._decide(filename)
        return hit

    def _decide(self, filename: str) -> bool:
        if filename == SETUP_FILENAME:
            return True
        if filename.startswith("<") or self.root is None:
            return False
        path = os.path.realpath(filename)
        if path.startswith(_PACKAGE_DIR + os.sep) and not path.startswith(_DEMO_DIR):
            return False
        if "site-packages" in path or "dist-packages" in path:
            return False
        return path.startswith(self.root)

    def location_of(self, filename: str, line: int, function: str) -> dict:
        return location(filename, line, function)

    def innermost(self, frame: FrameType | None = None, skip: int = 1) -> dict | None:
        """The innermost user frame of the current stack (or of `frame` outward)."""
        f: FrameType | None = frame if frame is not None else sys._getframe(skip)
        while f is not None:
            code = f.f_code
            if self.is_user_file(code.co_filename):
                return self.location_of(code.co_filename, f.f_lineno, code.co_name)
            f = f.f_back
        return None

    def user_stack(self, frame: FrameType | None = None, skip: int = 1, limit: int = 8) -> list[dict]:
        """User frames from the innermost outward (where a call made from the user's function ran)."""
        out: list[dict] = []
        f: FrameType | None = frame if frame is not None else sys._getframe(skip)
        while f is not None and len(out) < limit:
            code = f.f_code
            if self.is_user_file(code.co_filename):
                out.append(self.location_of(code.co_filename, f.f_lineno, code.co_name))
            f = f.f_back
        return out

    def trimmed_traceback(self, exc: BaseException) -> str:
        """The exception's traceback keeping only the user's frames (and the message)."""
        tb: TracebackType | None = exc.__traceback__
        frames = [fs for fs in traceback.extract_tb(tb) if self.is_user_file(fs.filename)]
        lines = ["Traceback (user frames only):"]
        lines += traceback.format_list(frames) if frames else ["  (no frame in the project)\n"]
        lines += traceback.format_exception_only(type(exc), exc)
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip()

    def innermost_of_traceback(self, exc: BaseException) -> dict | None:
        frames = [fs for fs in traceback.extract_tb(exc.__traceback__) if self.is_user_file(fs.filename)]
        if not frames:
            return None
        fs = frames[-1]
        return self.location_of(fs.filename, fs.lineno or 0, fs.name)
