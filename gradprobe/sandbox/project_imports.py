"""GP122: the user's command could not import a package of the project itself (parent side, torch-free).

A script run as the user runs it (`python scripts/run.py ARGS` from the repository root) has the script's own
directory first on `sys.path` and the root as its working directory; `python -m pkg.mod` has the working directory
first; a `src/` layout is importable through the project's editable install or through the script's own `sys.path`
line. When the code still fails with `No module named 'mypkg'` and `mypkg` is a package of the project (or of a
directory above project_dir, outside the sandbox's view), that is no missing dependency: the finding says which
directory the command ran from, what `sys.path` began with, where the package is, and what to set. It takes the place
of the GP100/GP112 the child reported (their evidence is kept), and the interpreter's "install it there" hint is not
given for it.
"""

from __future__ import annotations

import os
from typing import Any, cast

from gradprobe.findings import Finding, Rule, Situation
from gradprobe.target import Target

GP122: Rule[Any] = Rule(
    code="GP122", name="project-module-not-found", severity="error", rank=2,
    summary="The user's code could not import a package that is part of the project (or of the directory above "
            "project_dir): the command ran with a working directory or sys.path the project does not expect.",
    why="A `No module named 'mypkg'` for the project's own package is no missing dependency: `python scripts/run.py` puts "
        "scripts/ first on sys.path (not the working directory), `python -m` puts the working directory first, a src/ "
        "layout needs the project's editable install or a sys.path line of the script, and the sandbox shows the child "
        "project_dir only. Nothing was checked; the finding says which directory was used, what sys.path began with, "
        "where the package is and what to set.",
    example="scripts/run.py does `from mypkg import Net` and mypkg lives in src/, run with project_dir = scripts/",
    message="`{module}` is {where}, but the code could not import it: the command ran as {command} in {cwd}, so sys.path "
            "began with {path0}. {why}",
    fix="{fix}",
    situations={
        "inside": Situation(
            when="the package is inside project_dir, in a directory that is not on sys.path as the command ran",
            fix="{fix}"),
        "outside": Situation(
            when="the package is above project_dir, outside the sandbox's view (project_dir was set to a subdirectory, "
                 "e.g. the script's folder)",
            fix="{fix}"),
    },
)

_SKIP = {".git", ".hg", ".svn", ".venv", "venv", "env", "node_modules", "__pycache__", "site-packages", ".tox", ".mypy_cache",
         ".pytest_cache", "build", "dist", ".pixi"}
_MAX_DIRS = 4000


def _is_package(path: str, name: str) -> bool:
    return os.path.isfile(os.path.join(path, name, "__init__.py")) or os.path.isfile(os.path.join(path, name + ".py"))


def find_package(name: str, root: str, depth: int = 3, skip: str | None = None) -> list[str]:
    """Directories under `root` (to `depth` levels, `skip` left out) from which `import name` would work."""
    found: list[str] = []
    todo = [(root, 0)]
    seen = 0
    while todo and seen < _MAX_DIRS and len(found) < 5:
        here, level = todo.pop(0)
        seen += 1
        if _is_package(here, name):
            found.append(here)
        if level >= depth:
            continue
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if (e.is_dir(follow_symlinks=False) and e.name not in _SKIP and not e.name.startswith(".")
                    and (skip is None or os.path.realpath(e.path) != skip)):
                todo.append((e.path, level + 1))
    return found


def _missing(f: Finding) -> str | None:
    ev = f.get("evidence") or {}
    if f["code"] not in ("GP100", "GP112") or ev.get("exception") != "ModuleNotFoundError":
        return None
    text = f"{f.get('message', '')} {ev.get('traceback', '')}"
    i = text.find("No module named ")
    return text[i + 16:].split()[0].strip("'\".,:;)").split(".")[0] if i >= 0 else None


def _command(target: Target) -> tuple[str, str, str]:
    """How the command ran: (the command, sys.path[0], why Python put it there)."""
    project = os.path.realpath(target.project_dir)
    if target.script:
        path0 = os.path.dirname(os.path.join(project, target.script))
        return f"`python {target.script}`", path0, "Python puts the script's own directory first, not the working directory."
    if target.module:
        return f"`python -m {target.module}`", project, "Python puts the working directory first."
    return f"the model reference {target.model or 'in setup'}", project, "gradprobe puts project_dir first."


def _fix_inside(target: Target, home: str, project: str) -> str:
    rel = os.path.relpath(home, project)
    options = [f"install the project in the environment that runs it (`pip install -e .` in {project}, into its .venv: "
               "gradprobe uses the project's own environment, found from project_dir up, or the one `python` names)"]
    if target.script and rel == "." and os.path.dirname(target.script):
        module = os.path.splitext(target.script)[0].replace(os.sep, ".")
        options.insert(0, f'run it as a module from the project root, as `python -m {module}` would ("module": "{module}" '
                          f"in the target; gradprobe diagnose --module {module} on the command line)")
    options.append(f"or put {rel!r} on sys.path in the code, as the project means it "
                   f"(e.g. `sys.path.insert(0, str(Path(__file__).parents[N] / {rel!r}))`)")
    return "; ".join(options) + "."


def project_module_finding(f: Finding, target: Target) -> Finding | None:
    """GP122 in place of `f` (a GP100/GP112 for `No module named X`) when X is a package of the project or of a directory
    above it; None otherwise."""
    name = _missing(f)
    if not name or not target.project_dir:
        return None
    project = os.path.realpath(target.project_dir)
    command, path0, why = _command(target)
    ev = {**(f.get("evidence") or {}), "replaces": f["code"], "cwd": project, "sys_path_0": path0}
    inside = [p for p in find_package(name, project) if os.path.realpath(p) != os.path.realpath(path0)]
    if inside:
        home = inside[0]
        ev["package_dir"] = home
        where = f"a package of the project (in {os.path.relpath(home, project)}/)" if home != project else \
            "a package at the project's root"
        return GP122.finding("inside", location=f.get("location"), evidence=ev, module=name, where=where, command=command,
                             cwd=project, path0=path0, why=why + f" {home} is not on it.",
                             fix="Make it importable as the project means it: " + _fix_inside(target, home, project))
    for up in (os.path.dirname(project), os.path.dirname(os.path.dirname(project))):
        if up == project or not up or up == os.path.dirname(up):
            continue
        outside = find_package(name, up, depth=2, skip=project)
        if outside:
            ev["package_dir"] = outside[0]
            script = os.path.relpath(os.path.join(project, target.script), up) if target.script else None
            cli = f"gradprobe diagnose --script {script} -- ARGS" if script else "gradprobe diagnose ... from there"
            also = f", and script to {script!r}" if script else ""
            fix = (f"Set project_dir to {up} (the directory you run the command from){also}; on the command line run it "
                   f"from there: cd {up} && {cli}.")
            return GP122.finding("outside", location=f.get("location"), evidence=ev, module=name,
                                 where=f"in {outside[0]}, outside project_dir {project} (the sandbox shows the child "
                                       "project_dir only)", command=command, cwd=project, path0=path0,
                                 why="The project seems to be the directory above.", fix=fix)
    return None


def project_modules(report: dict[str, Any], target: Target) -> dict[str, Any]:
    """The report with each GP100/GP112 for a missing package of the project replaced by GP122."""
    findings = report.get("findings") or []
    out: list[Finding] = []
    changed = False
    for f in findings:
        g = project_module_finding(cast(Finding, f), target) if isinstance(f, dict) else None
        changed |= g is not None
        out.append(g if g is not None else f)
    if changed:
        report["findings"] = out
    return report
