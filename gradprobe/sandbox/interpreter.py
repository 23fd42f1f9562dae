"""Which interpreter runs a target, resolved once (parent side, standard library only, torch-free).

The order: the target's `python`; else the project's own environment, found in `project_dir` and its
parents up to the project's VCS root (with roots, over HTTP or --allow-root: the project only), and only one
its owner or root owns where nobody else could have put it (trust.py): `.venv/` (uv, Poetry and Pipenv
in-project environments too), `venv/`, `env/`, `.pixi/envs/default`, or the conda environment named in
`environment.yml` whose prefix `conda` reports; else the server's own interpreter. `"python": "server"`
forces the latter.

The interpreter is resolved ONCE: the file is opened (O_PATH) and that open file is what the child
executes (`/proc/self/fd/N`); the directories bound into the sandbox's view are the installation prefixes
derived from it, opened the same way and checked to hold that very file. A symlink flipped after the
choice changes nothing: no name is looked up again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gradprobe.sandbox.roots import inside
from gradprobe.sandbox.trust import search_dirs, untrusted

if TYPE_CHECKING:
    from gradprobe.sandbox.protocol import PythonExec

MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 1)
SUPPORTED = "Python >= 3.10 with torch >= 2.1"


def interpreter_error(exc: BaseException) -> str:
    """The tool error for an interpreter that lacks what the child needs."""
    return f"this interpreter cannot run gradprobe's checks (it needs torch): {type(exc).__name__}: {exc}"


def unusable_interpreter() -> str | None:
    """Why this interpreter cannot run the checks (no torch, a torch or Python too old), or None (standard library
    only: it runs before the protocol's models are imported). Called in the child, about the child's interpreter."""
    here = f"Python {sys.version.split()[0]}"
    if sys.version_info[:2] < MIN_PYTHON:
        return f"this interpreter is {here}, older than gradprobe supports ({SUPPORTED})"
    try:
        import torch
    except ImportError as exc:
        return f"this interpreter ({here}) has no torch ({type(exc).__name__}: {exc}); gradprobe needs {SUPPORTED}"
    version = str(getattr(torch, "__version__", "0"))
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if parts < MIN_TORCH:
        return f"this interpreter's torch is {version} ({here}), older than gradprobe supports ({SUPPORTED})"
    return None


SERVER = "server"  # `"python": "server"`: force the server's own interpreter
ENV_DIRS = (".venv", "venv", "env", ".pixi/envs/default")
HOW_TO_NAME = ('name the right one with the target\'s `python` (an absolute path, e.g. "/home/ana/proj/.venv/bin/python"; '
               '`--python` on the command line), or `"python": "server"` for the server\'s own')


class InterpreterError(ValueError):
    """The interpreter named or found cannot be used; the message says why and what to do."""


@dataclass
class Interpreter:
    """The interpreter one call runs: `real` is the exact file (held open as `fd`), `argv0` what the child sees as its
    own path (a venv's bin/python, so that Python finds its pyvenv.cfg), `trees` the directories (or the single file)
    bound read-only into the view, each held open."""

    path: str
    real: str
    env: str
    reason: str
    source: str  # "target", "project" or "server"
    looked_at: tuple[str, ...] = ()
    fd: int | None = None
    argv0: str = ""
    trees: tuple[tuple[str, int], ...] = field(default=())

    @property
    def is_server(self) -> bool:
        return self.source == "server"

    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.fd, *(t[1] for t in self.trees)) if fd is not None)

    def exec_spec(self) -> PythonExec:
        """What the launcher needs (fds are passed to it at the same numbers)."""
        from gradprobe.sandbox.protocol import OpenTree, PythonExec

        return PythonExec(fd=self.fd, argv0=self.argv0 or self.real, trees=[OpenTree(path=p, fd=fd) for p, fd in self.trees])

    def close(self) -> None:
        for fd in self.fds():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd, self.trees = None, ()

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "resolved": self.real, "environment": self.env, "chosen_because": self.reason,
                "source": self.source, "looked_at": list(self.looked_at)}


def server_interpreter(reason: str, looked_at: tuple[str, ...] = ()) -> Interpreter:
    return Interpreter(path=sys.executable, real=os.path.realpath(sys.executable), env=os.path.realpath(sys.prefix),
                       reason=reason, source=SERVER, looked_at=looked_at)


def _fd_path(fd: int, *rest: str) -> str:
    return os.path.join(f"/proc/self/fd/{fd}", *rest)


def _open_prefix(prefix: str, binary: os.stat_result, name: str, venv: bool) -> tuple[str, int] | None:
    """Open `prefix` and keep it only if it is an installation (pyvenv.cfg for a venv, lib/python3* otherwise) whose
    bin/`name` is the very file chosen (same device and inode, seen through the open directory)."""
    if prefix in ("/", ""):
        return None
    try:
        fd = os.open(prefix, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        looks = (os.path.isfile(_fd_path(fd, "pyvenv.cfg")) if venv else
                 any(n.startswith("python3") for n in _listdir(_fd_path(fd, "lib"))))
        st = os.stat(_fd_path(fd, "bin", name))
        if looks and (st.st_dev, st.st_ino) == (binary.st_dev, binary.st_ino):
            return os.readlink(_fd_path(fd)), fd
    except OSError:
        pass
    os.close(fd)
    return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _open_file(path: str) -> int:
    """O_PATH of `path` (symlinks followed once, now), or a clear InterpreterError."""
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InterpreterError(
                f"python {path!r} is a dangling link: it points to {os.readlink(path)!r}, which does not exist (the "
                "environment was made from an interpreter that is gone: recreate it, e.g. `python -m venv --clear`)") from None
        raise InterpreterError(f"python {path!r} does not exist") from None
    except OSError as exc:
        raise InterpreterError(f"python {path!r} cannot be opened: {exc.strerror}") from None


def resolve(path: str, reason: str, source: str, looked_at: tuple[str, ...] = ()) -> Interpreter:
    """Open the interpreter once and derive what to bind from the open file (raises InterpreterError)."""
    if not os.path.isabs(path):
        raise InterpreterError(f"python {path!r} is a relative path: write the absolute path of the interpreter, e.g. "
                               '"/home/ana/proj/.venv/bin/python" (a server has no directory of yours to resolve it against)')
    fd = _open_file(path)
    try:
        real = os.readlink(_fd_path(fd))
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            inside = os.path.join(path, "bin", "python")
            raise InterpreterError(f"python {path!r} is a directory: name the interpreter inside it, e.g. {inside!r}")
        if not stat.S_ISREG(st.st_mode) or not os.access(_fd_path(fd), os.X_OK):
            raise InterpreterError(f"python {path!r} is not an executable file")
        named = os.path.abspath(path)
        venv = _open_prefix(os.path.dirname(os.path.dirname(named)), st, os.path.basename(named), venv=True)
        base = _open_prefix(os.path.dirname(os.path.dirname(real)), st, os.path.basename(real), venv=False)
        trees = tuple(t for t in (venv, base) if t is not None)
        if base is None:  # not an installation we recognise: only the file itself is bound
            trees += ((real, os.open(_fd_path(fd), os.O_PATH | os.O_CLOEXEC)),)
        env = venv[0] if venv else base[0] if base else real
        argv0 = os.path.join(venv[0], "bin", os.path.basename(named)) if venv else real
        return Interpreter(path=named, real=real, env=env, reason=reason, source=source, looked_at=looked_at,
                           fd=fd, argv0=argv0, trees=trees)
    except BaseException:
        os.close(fd)
        raise


_CONDA: dict[str, list[str]] = {}


def _conda_prefixes() -> list[str]:
    """The environments `conda env list` reports (cached; [] when conda is not there or does not answer)."""
    exe = os.environ.get("CONDA_EXE") or shutil.which("conda") or ""
    if exe not in _CONDA:
        try:
            out = subprocess.run([exe, "env", "list", "--json"], capture_output=True, timeout=20, check=True,
                                 stdin=subprocess.DEVNULL)
            _CONDA[exe] = [str(p) for p in json.loads(out.stdout).get("envs", [])]
        except (OSError, ValueError, subprocess.SubprocessError, AttributeError):
            _CONDA[exe] = []
    return _CONDA[exe]


def _conda_env(directory: str, looked: list[str]) -> str | None:
    spec = os.path.join(directory, "environment.yml")
    try:
        text = open(spec, encoding="utf-8", errors="replace").read(65536)
    except OSError:
        return None
    match = re.search(r"^name:\s*['\"]?([\w.-]+)", text, re.M)
    if not match:
        return None
    name = match.group(1)
    for prefix in _conda_prefixes():
        if os.path.basename(prefix.rstrip("/")) == name:
            return os.path.join(prefix, "bin", "python")
    looked.append(f"{spec} (conda environment {name!r}: conda reports no such environment)")
    return None


def find_project_env(project_dir: str, strict: bool = False) -> tuple[str | None, list[str]]:
    """The first environment in the project or a parent up to the project's VCS root (`strict`: the project only) that
    the project's owner or root owns and nobody else could have put there (trust.py): its bin/python, and what was
    looked at (a candidate skipped says why)."""
    looked: list[str] = []
    for d in search_dirs(project_dir, strict):
        for name in ENV_DIRS:
            cand = os.path.join(d, name, "bin", "python")
            if not os.path.lexists(cand):
                looked.append(os.path.join(d, name))
                continue
            why = untrusted(d, f"{name}/bin/python", project_dir)
            if why is None:
                looked.append(os.path.join(d, name))
                return cand, looked
            looked.append(f"{os.path.join(d, name)} (skipped: {why})")
        if os.path.lexists(os.path.join(d, "environment.yml")):
            why = untrusted(d, "environment.yml", project_dir)
            if why is not None:
                looked.append(f"{os.path.join(d, 'environment.yml')} (skipped: {why})")
                continue
        conda = _conda_env(d, looked)
        if conda:
            return conda, looked
    return None, looked


@dataclass(frozen=True)
class InterpreterPolicy:
    """What the server accepts. `strict` (over HTTP, or with --allow-root): a named interpreter only when listed with
    --allow-python (its environment and its file both match), a found one only inside an allowed root or listed."""

    roots: tuple[str, ...] = ()
    allowed: tuple[tuple[str, str], ...] = ()  # (environment, exact file) of each --allow-python
    strict: bool = False

    @classmethod
    def make(cls, roots: list[str] | tuple[str, ...], allow_python: list[str] | tuple[str, ...],
             strict: bool) -> InterpreterPolicy:
        allowed = []
        for path in allow_python:
            try:
                interp = resolve(os.path.abspath(path), "listed", "target")
            except InterpreterError:
                continue
            interp.close()
            allowed.append((interp.env, interp.real))
        return cls(tuple(os.path.realpath(r) for r in roots), tuple(allowed), strict)

    def listed(self, interp: Interpreter) -> bool:
        server = server_interpreter("")
        return (interp.env, interp.real) in self.allowed or (interp.env, interp.real) == (server.env, server.real)

    def inside(self, interp: Interpreter) -> bool:
        """A found environment counts over HTTP when it lives in an allowed root and the file it runs does too (or is
        the server's own or a listed interpreter's)."""
        reals = {server_interpreter("").real} | {real for _, real in self.allowed}
        return inside(interp.env, self.roots) and (inside(interp.real, self.roots) or interp.real in reals)


def choose(python: str | None, project_dir: str, policy: InterpreterPolicy | None = None) -> Interpreter:
    """The interpreter for one call, resolved and held open (close() it after the call). Raises InterpreterError."""
    policy = policy or InterpreterPolicy()
    if python == SERVER:
        return server_interpreter('forced by "python": "server"')
    if python:
        interp = resolve(python, "named by the target's `python`", "target")
        if policy.strict and not policy.listed(interp):
            interp.close()
            raise InterpreterError(f"python {python!r} is not an interpreter this server allows (--allow-python)")
        return interp
    found, looked = find_project_env(project_dir, strict=policy.strict)
    if found is None:
        return server_interpreter("no environment of the project's own was found", tuple(looked))
    env_dir = os.path.dirname(os.path.dirname(found))
    interp = resolve(found, f"the project's own environment ({env_dir})", "project", tuple(looked))
    server = server_interpreter(f"the project's own environment ({env_dir}), which is the server's own", tuple(looked))
    if (interp.env, interp.real) == (server.env, server.real):  # the same interpreter: the warm worker serves it
        interp.close()
        return server
    if policy.strict and not (policy.inside(interp) or policy.listed(interp)):
        interp.close()
        return server_interpreter(
            f"the project's environment {env_dir} was ignored: it is outside this server's allowed roots and not "
            "listed with --allow-python", (*looked, f"{env_dir} (ignored: not allowed on this server)"))
    return interp


def describe(facts: dict[str, Any]) -> str:
    """One line for the report's summary: which interpreter ran, its versions, and why."""
    versions = ", ".join(x for x in (f"Python {facts['python_version']}" if facts.get("python_version") else "",
                                     f"torch {facts['torch_version']}" if facts.get("torch_version") else "") if x)
    shown = f" ({versions})" if versions else ""
    return f"Interpreter: {facts.get('path')}{shown}; chosen: {facts.get('chosen_because')}."


def missing_module_hint(module: str, facts: dict[str, Any]) -> str:
    """What to say when the user's code imports a module this interpreter does not have."""
    looked = facts.get("looked_at") or []
    where = f" Environments looked at: {', '.join(looked[:8])}{' ...' if len(looked) > 8 else ''}." if looked else ""
    return (f"No module named {module!r} in the interpreter that ran the code, {facts.get('path')} "
            f"({facts.get('chosen_because')}).{where} Install it there, or {HOW_TO_NAME}.")
