"""Which frames are the user's, and how to point at one of their lines.

Findings name the user's own `file:line`, never a line inside torch or
transformers. A frame is the user's when its file lies under the project
directory (and not in an installed package) or is inline `setup` source.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

SETUP_FILENAME = "<gradprobe-setup>"
# gradprobe's own code is told by the installed package's resolved directory, never by a name in a path: a user's
# project may well sit under a folder named `gradprobe` (a clone made with the default name)
PACKAGE_DIR = str(Path(__file__).resolve().parent)
_DEMO_DIR = os.path.join(PACKAGE_DIR, "demo") + os.sep  # the bundled broken model is user code


@functools.lru_cache(maxsize=4096)
def is_gradprobe_file(filename: str) -> bool:
    """Whether a code file is gradprobe's own (its bundled demo model excepted: that is user code)."""
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    return path.startswith(PACKAGE_DIR + os.sep) and not path.startswith(_DEMO_DIR)


_RUNS_THE_SCRIPT = (os.path.join("scriptmode", "run.py"), os.path.join("sandbox", "run_check.py"))


def raised_in_gradprobe(exc: BaseException | None) -> bool:
    """Whether an error the script "raised" was raised inside gradprobe's own code (a hook or watch of ours, or a library
    call it made), rather than by the user's code: the innermost frame that is either the user's or gradprobe's is
    gradprobe's (gradprobe/verdict.py: a check that did not run because of gradprobe is gradprobe's, never the user's).
    The frames that run the script itself (scriptmode/run.py, sandbox/run_check.py) count as neither."""
    last = None
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if is_gradprobe_file(name):
            last = "ours" if not os.path.realpath(name).endswith(_RUNS_THE_SCRIPT) else last
        elif not _library(name):
            last = "user"
        tb = tb.tb_next
    return last == "ours"


def _library(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path or path.startswith(("<", os.path.dirname(os.__file__)))


def location(filename: str, line: int, function: str) -> dict[str, Any]:
    """A finding's location: file, line, function and the source text of that line. A line inside a statement
    spread over several lines names the statement's first line (`x = f(\n ...\n).detach()` is one statement)."""
    line = statement_start(filename, int(line))
    return {"file": filename, "line": line, "function": function, "code": linecache.getline(filename, line).strip()}


class _Shape:
    """What findings need of a source file's structure, from one parse: the first line of the statement that spans
    each line of a multi-line statement, and the line spans of its function definitions."""

    def __init__(self, filename: str) -> None:
        self.starts: dict[int, int] = {}
        self.defs: list[tuple[int, int]] = []
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            return
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node.end_lineno is not None:
                self.defs.append((node.lineno, node.end_lineno))
            if not isinstance(node, ast.stmt) or node.end_lineno is None or node.end_lineno == node.lineno:
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.decorator_list:
                continue  # decorators and def lines: leave as they are
            body = getattr(node, "body", None)
            # a compound statement owns only its header lines; its body's statements own theirs
            end = body[0].lineno - 1 if isinstance(body, list) and body and isinstance(body[0], ast.stmt) else node.end_lineno
            for ln in range(node.lineno + 1, end + 1):
                self.starts[ln] = node.lineno


_SHAPES: dict[str, _Shape] = {}


def _shape(filename: str) -> _Shape:
    shape = _SHAPES.get(filename)
    if shape is None:
        shape = _Shape(filename)
        if len(_SHAPES) < 2000:
            _SHAPES[filename] = shape
    return shape


def statement_start(filename: str, line: int) -> int:
    """The first line of the simple statement (or compound statement's header) that spans `line`."""
    return _shape(filename).starts.get(line, line)


def enclosing_def(filename: str, line: int) -> int | None:
    """The first line of the innermost function definition whose body holds `line` (None at module level)."""
    inside = [(a, b) for a, b in _shape(filename).defs if a <= line <= b]
    return max(inside)[0] if inside else None


class UserCode:
    """Decides, with a cache, whether a code file belongs to the user's project."""

    def __init__(self, project_dir: str | None) -> None:
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
        if is_gradprobe_file(filename):
            return False
        path = os.path.realpath(filename)
        if "site-packages" in path or "dist-packages" in path:
            return False
        return path.startswith(self.root)

    def location_of(self, filename: str, line: int, function: str) -> dict[str, Any]:
        return location(filename, line, function)

    def files(self) -> list[str]:
        """The user's files seen so far (every file a frame of the step ran in and that belongs to the project)."""
        return [f for f, hit in self._cache.items() if hit and not f.startswith("<")]

    def innermost(self, frame: FrameType | None = None, skip: int = 1) -> dict[str, Any] | None:
        """The innermost user frame of the current stack (or of `frame` outward)."""
        f: FrameType | None = frame if frame is not None else sys._getframe(skip)
        while f is not None:
            code = f.f_code
            if self.is_user_file(code.co_filename):
                return self.location_of(code.co_filename, f.f_lineno, code.co_name)
            f = f.f_back
        return None

    def user_stack(self, frame: FrameType | None = None, skip: int = 1, limit: int = 8) -> list[dict[str, Any]]:
        """User frames from the innermost outward (where a call made from the user's function ran)."""
        out: list[dict[str, Any]] = []
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

    def innermost_of_traceback(self, exc: BaseException) -> dict[str, Any] | None:
        frames = [fs for fs in traceback.extract_tb(exc.__traceback__) if self.is_user_file(fs.filename)]
        if not frames:
            return None
        fs = frames[-1]
        return self.location_of(fs.filename, fs.lineno or 0, fs.name)
