"""Whether an environment found near a project may run for it: who owns it and who could have put it there.

git's `safe.directory` idea, applied to the interpreter search (interpreter.find_project_env): a `.venv/bin/python` or
an `environment.yml` counts only when every step of its path from the folder it was found in (that folder, the
environment directory, `bin`, the file itself, as links and as what they point to) belongs to the project's owner or
to root, and none of those folders is writable by everyone (a world-writable or sticky folder, like /tmp, is a place
anyone could have planted it). The search looks in the project and its parents up to the project's own VCS root
(.git, .hg, .svn, .jj) at most; with roots (over HTTP, or --allow-root) only in the project itself.
"""

from __future__ import annotations

import os
import stat

VCS_MARKS = (".git", ".hg", ".svn", ".jj")


def search_dirs(project_dir: str, strict: bool) -> list[str]:
    """Where to look, nearest first: the project alone (`strict`), else the project and its parents up to the first
    that holds a VCS mark (the project's own repository); the project alone when none does."""
    here = os.path.realpath(project_dir)
    if strict:
        return [here]
    chain, d = [], here
    while True:
        chain.append(d)
        if any(os.path.lexists(os.path.join(d, m)) for m in VCS_MARKS):
            return chain
        parent = os.path.dirname(d)
        if parent == d:
            return [here]
        d = parent


def _why_not(path: str, owners: set[int], folder: bool) -> str | None:
    """Why `path` (as a link and as what it points to) cannot be trusted, or None."""
    for st, how in ((os.lstat, "is"), (os.stat, "points to something")):
        try:
            info = st(path)
        except OSError:
            return None if how != "is" else "cannot be read"
        if info.st_uid not in owners:
            return f"{path} {how} owned by uid {info.st_uid}, not the project's owner or root"
        if folder and stat.S_ISDIR(info.st_mode) and info.st_mode & (stat.S_IWOTH | stat.S_ISVTX):
            kind = "sticky" if info.st_mode & stat.S_ISVTX else "world-writable"
            return f"{path} is a {kind} folder: anyone could have put it there"
    return None


def untrusted(found_in: str, rel: str, project_dir: str) -> str | None:
    """Why the environment file `found_in`/`rel` (e.g. ".venv/bin/python", "environment.yml") must not run for a
    project whose owner is the owner of `project_dir`; None when every step of its path is theirs or root's."""
    try:
        owners = {os.stat(project_dir).st_uid, 0}
    except OSError:
        return "the project cannot be read"
    parts = rel.split("/")
    path = found_in
    why = _why_not(path, owners, folder=True)
    for i, part in enumerate(parts):
        if why:
            return why
        path = os.path.join(path, part)
        why = _why_not(path, owners, folder=i < len(parts) - 1)
    return why
