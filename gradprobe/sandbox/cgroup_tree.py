"""Where a server's calls get their cgroups, and the one memory budget all of them share.

Each server owns one subtree, `<parent>/gradprobe/srv-<pid>-<start>/`, per hierarchy; every call's group is made
in it (cgroups.CallCgroup). The parent is the hierarchy's top, except where the server's own group (or one above
it) limits memory or processes (a systemd `MemoryMax=`, a container's limit, any group made for it): then the
subtree is made *below the server's own group*, so what the calls use is charged to the group that bounds the
server, and they can never take more than it allows. That nesting is done on the v1 hierarchies (the hybrid layout);
on a pure v2 hierarchy a group that holds processes cannot have children with controllers (the no-internal-process
rule), so there the subtree stays at the top and the server's own limits are copied onto it. Either way the
subtree's memory limit is the server's budget for all calls together (Runtime holds each call's cap against it),
never more than the limit of the group that bounds the server.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

BASE = "/sys/fs/cgroup"
UNLIMITED = 1 << 60
SPARE_MARGIN = 256 << 20  # room in the subtree for the next call's spare, beyond the calls' budget


def _read_int(path: str) -> int | None:
    try:
        text = open(path).read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def own_groups() -> dict[str, str]:
    """This process's group in each hierarchy: {"": path} for v2, {controller: path} for each v1 hierarchy."""
    out: dict[str, str] = {}
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def _chain(base: str, path: str) -> list[str]:
    """The group at `path` in the hierarchy mounted at `base`, and each group above it (not the top)."""
    out = []
    while path not in ("/", ""):
        out.append(base + path.rstrip("/"))
        path = os.path.dirname(path)
    return out


def chain_limit(base: str, path: str, fname: str) -> int | None:
    """The lowest `fname` limit on the chain from the group at `path` up (None: nothing there limits it)."""
    values = [v for v in (_read_int(os.path.join(d, fname)) for d in _chain(base, path)) if v is not None and v < UNLIMITED]
    return min(values) if values else None


def bounding_memory() -> int | None:
    """The memory limit of the group that bounds this process (v2 memory.max, v1 memory.limit_in_bytes), if any."""
    own = own_groups()
    limits = []
    if "" in own:
        limits.append(chain_limit(BASE, own[""], "memory.max"))
    if "memory" in own:
        limits.append(chain_limit(os.path.join(BASE, "memory"), own["memory"], "memory.limit_in_bytes"))
    found = [x for x in limits if x]
    return min(found) if found else None


@dataclass(frozen=True)
class Placement:
    """Where the server's subtree goes in each hierarchy: (kind, parent dir). kind is "v2" (a pure v2 hierarchy),
    "unified" (the v2 part of the hybrid layout, for cgroup.kill), "memory" or "pids" (v1)."""

    parents: tuple[tuple[str, str], ...]
    nested: tuple[str, ...]  # the kinds placed below the server's own group

    def describe(self) -> str:
        return ("below the server's own group (" + ", ".join(self.nested) + ")") if self.nested else "at the top"


@functools.lru_cache(maxsize=1)
def placement() -> Placement:
    """The parents of this server's subtree (see the module docstring); read once per process (its group does not
    change: the warm worker's spares get the server's in their policy)."""
    own = own_groups()
    if os.path.exists(os.path.join(BASE, "cgroup.controllers")):  # pure v2: the top, the server's limits copied
        return Placement((("v2", BASE),), ())
    parents: list[tuple[str, str]] = []
    nested: list[str] = []
    if os.path.isdir(os.path.join(BASE, "unified")):
        parents.append(("unified", os.path.join(BASE, "unified")))
    for kind, fname in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
        base = os.path.join(BASE, kind)
        if not os.path.isdir(base):
            continue
        path = own.get(kind, "/")
        if chain_limit(base, path, fname) is not None:
            parents.append((kind, base + path.rstrip("/")))
            nested.append(kind)
        else:
            parents.append((kind, base))
    return Placement(tuple(parents), tuple(nested))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def make_subtree(server: str, place: Placement, budget: int | None) -> str | None:
    """Make `<parent>/gradprobe/<server>/` in each hierarchy, its memory limit the calls' budget (plus room for a
    spare), never above what bounds the server; controllers enabled for the calls on a v2 hierarchy. Returns why it
    could not be made (None: made, or nothing to do)."""
    errors = []
    for kind, parent in place.parents:
        top, mine = os.path.join(parent, "gradprobe"), os.path.join(parent, "gradprobe", server)
        try:
            os.makedirs(mine, exist_ok=True)
            if kind == "v2":
                for d in (parent, top, mine):
                    enable(d)
            cap = _subtree_cap(kind, parent, budget)
            if cap is not None:
                _write(os.path.join(mine, "memory.max" if kind == "v2" else "memory.limit_in_bytes"), str(cap))
        except OSError as exc:
            errors.append(f"{kind}: {exc.strerror or exc}")
    return "; ".join(errors) or None


def enable(group: str) -> None:
    """Let `group`'s children have memory and pids limits (v2 subtree_control), as far as the group itself may."""
    try:
        have = open(os.path.join(group, "cgroup.controllers")).read().split()
    except OSError:
        return
    want = [c for c in ("memory", "pids") if c in have]
    if want:
        try:
            _write(os.path.join(group, "cgroup.subtree_control"), " ".join("+" + c for c in want))
        except OSError:
            pass


def _subtree_cap(kind: str, parent: str, budget: int | None) -> int | None:
    if kind not in ("v2", "memory") or budget is None:
        return None
    cap = budget + SPARE_MARGIN
    bound = bounding_memory()
    return min(cap, bound) if bound else cap


def remove_subtree(server: str, place: Placement) -> None:
    """A server going away removes its own (empty) subtree; what is left is removed by the next server (clean_stale)."""
    for _, parent in place.parents:
        try:
            os.rmdir(os.path.join(parent, "gradprobe", server))
        except OSError:
            pass
