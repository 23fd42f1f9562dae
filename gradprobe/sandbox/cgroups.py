"""A cgroup per call, made by the parent: memory and pids limits, and a kill of the whole tree.

`RLIMIT_NPROC` does nothing for root and `killpg` misses a process that called
setsid(); a cgroup catches both. Works with cgroup v2 (cgroup.kill, memory.max,
pids.max) and with the hybrid layout (v1 memory/pids controllers beside a v2
hierarchy at /sys/fs/cgroup/unified). Where no cgroup is writable, calls fall back
to rlimits and process groups, and the report says so.

Each server process owns one subtree, `gradprobe/srv-<pid>-<start time>/`, and puts
its calls' groups in it; a starting server removes only the subtrees of servers
that are gone (their pid no longer runs with that start time), never another live
server's calls.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

from gradprobe.sandbox.cgroup_tree import enable, placement
from gradprobe.sandbox.protocol import Layer

BASE = "/sys/fs/cgroup"
PARENTS = (BASE, os.path.join(BASE, "unified"), os.path.join(BASE, "memory"), os.path.join(BASE, "pids"))


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


_SERVER_DIRS: dict[int, str] = {}


def server_dir_name(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    if pid not in _SERVER_DIRS:
        _SERVER_DIRS[pid] = f"srv-{pid}-{_start_time(pid)}"
    return _SERVER_DIRS[pid]


class CallCgroup:
    """`server`: the subtree to make it in (default: this process's own; the warm worker makes its spares' groups in
    the server's subtree, and hands each over with its call: `state()` there, `adopt()` here)."""

    def __init__(self, memory_bytes: int | None, pids_max: int = 512, server: str | None = None,
                 parents: dict[str, str] | None = None):
        self.name = f"gradprobe-{uuid.uuid4().hex[:12]}"
        self.server = server or server_dir_name()
        self.dirs: list[str] = []
        self.kill_file: str | None = None
        self.memory_dir: str | None = None
        self.pids_limited = False
        self.error: str | None = None
        try:
            self._make(memory_bytes, pids_max, parents if parents is not None else dict(placement().parents))
        except OSError as exc:
            self.error = f"{exc.strerror or exc}"
            self.remove()

    def state(self) -> dict:
        return {"name": self.name, "server": self.server, "dirs": self.dirs, "kill_file": self.kill_file,
                "memory_dir": self.memory_dir, "pids_limited": self.pids_limited, "error": self.error}

    @classmethod
    def adopt(cls, state: dict) -> CallCgroup:
        """The group another process of this server made (the warm worker, for a spare): this one tears it down."""
        self = cls.__new__(cls)
        self.name, self.server = str(state["name"]), str(state["server"])
        self.dirs = [str(d) for d in state.get("dirs") or []]
        self.kill_file, self.memory_dir = state.get("kill_file"), state.get("memory_dir")
        self.pids_limited, self.error = bool(state.get("pids_limited")), state.get("error")
        return self

    def _mk(self, parent: str) -> str:
        path = os.path.join(parent, "gradprobe", self.server, self.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path)
        self.dirs.append(path)
        return path

    def _make(self, memory_bytes: int | None, pids_max: int, parents: dict[str, str]) -> None:
        """The call's group in the server's subtree of each hierarchy (`parents`: cgroup_tree.placement)."""
        for kind, parent in parents.items():
            if kind == "memory" and not memory_bytes:
                continue
            d = self._mk(parent)
            if kind == "v2":
                if not os.path.exists(os.path.join(d, "pids.max")):  # controllers not yet on for the subtree
                    for group in (parent, os.path.dirname(os.path.dirname(d)), os.path.dirname(d)):
                        enable(group)
                if memory_bytes:
                    _write(os.path.join(d, "memory.max"), str(memory_bytes))
                _write(os.path.join(d, "pids.max"), str(pids_max))
                self.kill_file, self.memory_dir, self.pids_limited = os.path.join(d, "cgroup.kill"), d, True
            elif kind == "unified":
                if os.path.exists(os.path.join(d, "cgroup.kill")):
                    self.kill_file = os.path.join(d, "cgroup.kill")
            elif kind == "memory":
                _write(os.path.join(d, "memory.limit_in_bytes"), str(memory_bytes))
                self.memory_dir = d
            elif kind == "pids":
                _write(os.path.join(d, "pids.max"), str(pids_max))
                self.pids_limited = True
        if not self.dirs:
            raise OSError("no writable cgroup hierarchy")

    @property
    def ok(self) -> bool:
        return bool(self.dirs) and self.error is None

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def describe(self) -> str:
        if not self.ok:
            return f"MISSING: cgroups unavailable ({self.error})"
        parts = ["memory" if self.memory_dir else None, "pids" if self.pids_limited else None,
                 "cgroup.kill" if self.kill_file else "kill by pid list"]
        return "per-call cgroup: " + ", ".join(p for p in parts if p)

    def oom_killed(self) -> bool:
        if not self.memory_dir:
            return False
        for fname, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                for line in open(os.path.join(self.memory_dir, fname)):
                    k, _, v = line.partition(" ")
                    if k == key and int(v) > 0:
                        return True
            except OSError:
                continue
        return False

    def kill_now(self) -> None:
        """Signal every process of the call once, without waiting (cgroup.kill, else the pid list)."""
        if self.kill_file:
            try:
                _write(self.kill_file, "1")
                return
            except OSError:
                pass
        for pid in self._pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """Kill every process of the call, daemons included, and wait until none is left."""
        self.kill_now()
        for _ in range(50):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.02)

    def _pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out |= {int(x) for x in open(f).read().split()}
            except (OSError, ValueError):
                pass
        return out

    def remove(self, tries: int = 50) -> None:
        """rmdir every directory of the group (retrying while its last processes exit); `dirs` keeps what is left."""
        left = []
        for d in reversed(self.dirs):
            for i in range(tries):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if i == tries - 1:
                        left.append(d)
                    else:
                        time.sleep(0.02)
        self.dirs = left[::-1]


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _server_alive(name: str) -> bool:
    try:
        _, pid, start = name.split("-", 2)
        return _start_time(int(pid)) == start
    except ValueError:
        return True  # not ours to judge


def clean_stale() -> None:
    """Remove the subtrees of gradprobe servers that are gone (killing what their calls left behind), at the top of
    each hierarchy and below this server's own group (where a server that shared it nested its calls)."""
    for parent in dict.fromkeys([*PARENTS, *(p for _, p in placement().parents)]):
        root = os.path.join(parent, "gradprobe")
        if not os.path.isdir(root):
            continue
        for name in os.listdir(root):
            server = os.path.join(root, name)
            if not name.startswith("srv-") or not os.path.isdir(server) or _server_alive(name):
                continue
            for call in os.listdir(server):
                d = os.path.join(server, call)
                if not os.path.isdir(d):
                    continue
                try:
                    _write(os.path.join(d, "cgroup.kill"), "1")
                except OSError:
                    pass
                try:
                    for pid in open(os.path.join(d, "cgroup.procs")).read().split():
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
                for _ in range(25):
                    try:
                        os.rmdir(d)
                        break
                    except OSError:
                        time.sleep(0.02)
            try:
                os.rmdir(server)
            except OSError:
                pass


def cgroup_layer(group: CallCgroup) -> Layer:
    """A call's cgroup as a layer of the report (enforced when it was made)."""
    return Layer.of(group.ok, group.describe().removeprefix("MISSING: "))
