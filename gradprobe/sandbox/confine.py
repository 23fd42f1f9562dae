"""Confine a freshly forked process, before any user code or user-named program runs in it.

Used by the cold launcher (`launch.py`, the server's own interpreter, which then
`exec`s the interpreter the target names) and by the warm worker's forked
children. Everything applied here is inherited across `exec`, so whatever runs
next (a Python, a shell script, a binary) is inside every layer:

1. cgroups: the process joins the per-call cgroups the server (a cold child) or the warm worker (a spare, made
   and joined before its call arrives) made;
2. namespaces: mount, pid, network, IPC and UTS; the process forks once: its
   child is pid 1 of the new pid namespace (when it exits, the kernel kills every
   process of the call) and this process stays outside as the *keeper*, which
   only waits and passes the exit status on;
3. a minimal file-system view (pivot_root into a tmpfs): read-only, nosuid binds
   of the system directories, the Python installation(s), gradprobe and the
   project, only the `/etc` files Python and torch read, a few `/dev` nodes, a
   fresh `/proc` of the call's own pid namespace, and private size-limited tmpfs
   for `/tmp` (which holds the scratch dir) and `/dev/shm`. No socket, device or
   file outside these exists in the child's world;
4. identity: uid/gid 65534 (nobody), no supplementary groups, no capabilities;
   the read-only binds are id-mapped so files owned by root read as the child's
   own: a Python installation or project inside a private (0700) home stays
   readable, while chmod/utime/write fail with EROFS;
5. Landlock (read-only everywhere, read-write /tmp and /dev/shm; TCP denied,
   signals and abstract Unix sockets scoped to the call), then seccomp
   (`isolation.seccomp_filter`), then rlimits.

The project directory is opened here, its real path checked against the
server's allowed roots, and that very directory (by file descriptor) is what
gets bound: replacing it by a symlink while the call waits changes nothing.

Each step's outcome is sent to the server on the control socket before the
user's code runs; the server then checks the process itself (/proc status,
namespaces) and answers "go" (see runner.py). The keeper and the confined child
share nothing with the user's code after that: the control socket is closed
before `exec` / before the job starts.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

from gradprobe.sandbox import isolation
from gradprobe.sandbox.protocol import ChildLimits, Control, Job, Layer, Policy

_libc = ctypes.CDLL(None, use_errno=True)
NOBODY = 65534

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT, SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 155, 428, 429, 442
OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH, AT_FDCWD = 1, 0x8000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 1, 2, 4, 0x100000

ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "hosts", "host.conf",
             "localtime", "timezone", "os-release", "alternatives", "protocols", "services", "mime.types", "gai.conf")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")

IDMAP_FD: int | None = None  # a user namespace mapping uid/gid 0 -> 65534, made once per process that confines


class Refused(Exception):
    """The call must not start (a path outside the roots, a layer required but missing)."""


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def make_idmap_userns() -> int | None:
    """An fd of a user namespace whose uid/gid 0 is 65534 outside, for id-mapped mounts (None if impossible)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            ok = _libc.unshare(CLONE_NEWUSER) == 0
            os.write(w, b"1" if ok else b"0")
            os.close(w)
            signal.pause()
        finally:
            os._exit(0)
    os.close(w)
    try:
        if os.read(r, 1) != b"1":
            return None
        for name, text in (("uid_map", f"0 {NOBODY} 1"), ("setgroups", "deny"), ("gid_map", f"0 {NOBODY} 1")):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _clone_tree(fd: int) -> int:
    """A detached copy of the mount tree at the opened directory `fd` (made before unshare: a mount of another
    namespace cannot be cloned afterwards)."""
    flags = ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | AT_EMPTY_PATH | os.O_CLOEXEC)
    return _check(_libc.syscall(SYS_OPEN_TREE, fd, b"", flags), "open_tree")


def _bind(source: str | int, target: str, idmap: int | None, writable: bool = False, devices: bool = False) -> bool:
    """Bind `source` (a path, or a detached tree from _clone_tree) at `target`, read-only and nosuid, id-mapped
    when the file system allows; returns whether the id mapping took."""
    if isinstance(source, int):
        tree = source
    else:
        flags = ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC)
        tree = _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), flags), f"open_tree {source}")
    try:
        base = (0 if writable else MOUNT_ATTR_RDONLY) | MOUNT_ATTR_NOSUID | (0 if devices else MOUNT_ATTR_NODEV)
        mapped = False
        for attrs, fd in (((base | MOUNT_ATTR_IDMAP), idmap), (base, None)):
            if attrs & MOUNT_ATTR_IDMAP and fd is None:
                continue
            buf = ctypes.create_string_buffer(struct.pack("QQQQ", attrs, 0, 0, fd or 0))
            where = ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE)
            if _libc.syscall(SYS_MOUNT_SETATTR, tree, b"", where, buf, ctypes.c_size_t(32)) == 0:
                mapped = bool(attrs & MOUNT_ATTR_IDMAP)
                break
        else:
            _check(-1, f"mount_setattr {target}")
        move = ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)
        _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), move), f"move_mount {target}")
        return mapped
    finally:
        os.close(tree)


def _place(root: str, path: str, is_dir: bool) -> str:
    """Create `path` under `root` (parents 0755), following the symlinks of the real system."""
    target = root + path
    parent = os.path.dirname(path)
    if parent != path and not os.path.lexists(root + parent):
        _place(root, parent, True)
    if os.path.lexists(target):
        return target
    if os.path.islink(path) and path != "/":
        os.symlink(os.readlink(path), target)
        return target
    if is_dir:
        os.mkdir(target, 0o755)
    else:
        open(target, "w").close()
    return target


def python_trees(python: str | None) -> list[str]:
    """Directories an interpreter needs: its installation prefix (a dir holding lib/python3* or pyvenv.cfg),
    for both the named path and its target; a non-Python program gets only its own file."""
    out = [sys.prefix, sys.base_prefix, sys.exec_prefix]
    if python:
        for p in (os.path.abspath(python), os.path.realpath(python)):
            prefix = os.path.dirname(os.path.dirname(p))
            looks = prefix not in ("/", "") and (os.path.exists(os.path.join(prefix, "pyvenv.cfg")) or any(
                n.startswith("python3") for n in _listdir(os.path.join(prefix, "lib"))))
            out.append(prefix if looks else p)
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def privileged() -> bool:
    """CAP_SYS_ADMIN in effect: a root server that can build every layer itself (root without capabilities cannot)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 21 & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def open_project(policy: Policy, clone: bool = True) -> tuple[int | None, str]:
    """Open the project directory and check *that* directory against the allowed roots; with `clone`, a detached
    copy of its mount tree (what gets bound into the view)."""
    want = policy.project_dir or ""
    try:
        fd = os.open(want, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"project_dir {want!r} cannot be opened: {exc.strerror}") from None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        roots = policy.allowed_roots
        if roots and not _inside(real, roots):
            raise Refused(f"project_dir {want!r} is outside the roots this server may read")
        return (_clone_tree(fd) if clone else None), real
    finally:
        os.close(fd)


def prepare_view(policy: Policy, newroot: str) -> tuple[list[str], list[bool]]:
    """In a new mount namespace, the part of the view every call shares: a tmpfs root at `newroot` (an empty dir,
    shadowed in this namespace only) with private /tmp, /dev, /dev/shm, /proc, /sys and the read-only binds.
    Returns the read-only paths (for Landlock) and which binds took the id mapping."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", newroot, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    # /tmp first: binds below it (a project in /tmp) go on top of the private tmpfs, not under it
    _place(newroot, "/tmp", True)
    _mount("tmpfs", newroot + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={policy.scratch_bytes},mode=1777")
    ro: list[str] = []
    mapped: list[bool] = []
    trees = list(SYSTEM_DIRS) + python_trees(policy.python) + [policy.package_root] + list(policy.extra_ro)
    seen: list[str] = []
    for path in sorted({os.path.abspath(p) for p in trees if p}, key=len):
        if not os.path.lexists(path) or path == "/":
            continue
        if os.path.islink(path) and os.path.dirname(path) == "/":
            _place(newroot, path, True)  # /bin -> usr/bin on merged-/usr systems
            continue
        real = os.path.realpath(path)
        if _inside(real, seen) or _inside("/tmp", [real]):  # /tmp (a server started there) is the call's own tmpfs
            continue
        seen.append(real)
        _place(newroot, real, os.path.isdir(real))
        mapped.append(_bind(real, newroot + real, IDMAP_FD))
        ro.append(real)
    _place(newroot, "/etc", True)
    for name in ETC_FILES:
        src = os.path.join("/etc", name)
        if os.path.exists(src):
            _bind(src, _place(newroot, src, os.path.isdir(src)), IDMAP_FD)
    ro.append("/etc")
    _place(newroot, "/dev", True)
    _mount("tmpfs", newroot + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEV_NODES + tuple(policy.devices):
        src = os.path.join("/dev", name)
        if os.path.exists(src):
            _bind(src, _place(newroot, src, os.path.isdir(src)), None, writable=True, devices=True)
    links = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))
    for name, target in links:
        os.symlink(target, newroot + "/dev/" + name)
    _place(newroot, "/dev/shm", True)
    _mount("tmpfs", newroot + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={policy.shm_bytes},mode=1777")
    _place(newroot, "/proc", True)
    _mount("proc", newroot + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _place(newroot, "/sys", True)
    _bind("/sys", newroot + "/sys", None)
    ro += ["/proc", "/sys"]
    return ro, mapped


def finish_view(policy: Policy, newroot: str, project_tree: int | None, ro: list[str], mapped: list[bool],
                report: dict[str, Layer]) -> None:
    """The call's own part: the project (the tree opened and checked), the scratch dir, then pivot_root."""
    scratch = policy.scratch
    if project_tree is not None:
        proj = policy.project_dir_real or ""
        if not _inside(proj, ro):
            mapped.append(_bind(project_tree, _place(newroot, proj, True), IDMAP_FD))  # closes project_tree
            ro.append(proj)
        else:
            os.close(project_tree)
    if not scratch.startswith("/tmp/"):
        raise Refused("the scratch dir must live under /tmp")
    os.makedirs(newroot + scratch, 0o700)
    try:
        os.chown(newroot + scratch, NOBODY, NOBODY)
    except OSError:
        pass  # in an unprivileged user namespace 65534 is not mapped: the call keeps the server's uid
    os.mkdir(newroot + "/.old")
    os.chdir(newroot)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_BIND | 32 | MS_RDONLY | MS_NOSUID | MS_NODEV)  # MS_REMOUNT: the view's own root read-only
    os.chdir(scratch)
    report["view"] = Layer.of(True, f"pivot_root into a minimal tree: {len(ro)} read-only binds ({sum(mapped)} id-mapped), "
                              f"fresh /proc, private tmpfs /tmp ({policy.scratch_bytes >> 20} MiB, holds scratch) and "
                              f"/dev/shm ({policy.shm_bytes >> 20} MiB)")


def drop_identity() -> str:
    for cap in range(64):
        _libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    _check(_libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    return f"uid/gid {NOBODY}, no groups, no capabilities (bounding set empty), no_new_privs"


def apply_rlimits(limits: ChildLimits) -> None:
    import resource

    def cap(which: int, value: Any) -> None:
        if value is None:
            return
        try:
            _soft, hard = resource.getrlimit(which)
            value = int(value)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            pass

    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_AS, limits.memory_bytes)
    cap(resource.RLIMIT_CPU, limits.cpu_seconds)
    cap(resource.RLIMIT_FSIZE, limits.file_bytes)
    cap(resource.RLIMIT_NOFILE, limits.open_files)


def _keeper(child: int) -> None:
    """Outside the call's pid namespace: pass the child's fate on as our own, and nothing else."""
    os.closerange(3, 1 << 16)  # nothing of the call's (control socket, result pipe) stays open here
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(70)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.WEXITSTATUS(status))


def close_other_fds(keep: set[int]) -> None:
    """Close every descriptor but `keep`: the user's code holds only the call's own (stdio, result pipe)."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]  # the listing's own descriptor is closed by now
    except OSError:
        fds = list(range(3, 1 << 16))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


_CONTROL: list[socket.socket] = []  # the call's control socket while confine() runs


def send_refusal(why: str) -> None:
    if _CONTROL:
        send(_CONTROL[0], Control(refused=why))
    os._exit(71)


def send(sock: socket.socket, msg: Control | dict[str, object]) -> None:
    """A Control message to the server (the control socket), or a plain one to the warm worker (a spare's socket)."""
    line = msg.model_dump_json(exclude_none=True) if isinstance(msg, Control) else json.dumps(msg)
    sock.sendall((line + "\n").encode())


NS_FLAGS = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
NS_REPORT = "mount, pid (own /proc; the call's processes die with it), network (no interface up), IPC, UTS"
NET_REPORT = "own network namespace: no interface but a down loopback"
NET_REPORT_LO = "own network namespace: only its private loopback, up (a torchrun-style rendezvous on 127.0.0.1)"
_LOOPBACK = [False]  # the call's own loopback is up: IPv4 on it is allowed (Landlock TCP, seccomp AF_INET)


def _map_own_ids(uid: int, gid: int) -> None:
    """In a user namespace just made without privilege: map our own uid/gid (the only mapping allowed then)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def enter_namespaces(tell: Callable[[int], None], user: bool = False) -> bool:
    """unshare every namespace and fork: returns True in the child (pid 1 of the new pid namespace); this process
    becomes the keeper (never returns). `tell(child_pid)` lets the server know the child's pid. False if unshare
    failed (nothing changed). With `user` (a server without root), a user namespace first, as bubblewrap does
    unprivileged: the others belong to it, and its capabilities build the view."""
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(NS_FLAGS | (CLONE_NEWUSER if user else 0)) != 0:
        return False
    if user:
        try:
            _map_own_ids(uid, gid)
        except OSError as exc:  # in the new namespaces already: no way back to the weaker path
            send_refusal(f"could not build the sandbox: user namespace id map: {exc.strerror}")
    _LOOPBACK[0] = isolation.loopback_up()[0]  # still root in the new network namespace
    child = os.fork()
    if child != 0:
        tell(child)
        _keeper(child)
    isolation.die_with_parent()
    os.setsid()
    return True


def lock_down(policy: Policy, ro: list[str], report: dict[str, Layer], control: socket.socket, private: bool = True) -> None:
    """After the view: Landlock, seccomp, rlimits; then tell the server and wait for its "go". Without a `private`
    view (its own /tmp and /dev/shm), only the call's scratch dir is writable: no other call's is even readable."""
    rw = ["/tmp", "/dev/shm", policy.scratch] if private else [policy.scratch]
    ok, how = isolation.landlock(ro, rw, ["/dev/" + n for n in DEV_NODES], tcp=_LOOPBACK[0])
    report["filesystem"] = Layer.of(ok, how)
    ok, how = isolation.seccomp_filter(inet=_LOOPBACK[0])
    report["syscalls"] = Layer.of(ok, how)
    apply_rlimits(policy.limits)
    missing = [k for k, v in report.items() if v.missing]
    if policy.require and missing:
        shown = {k: v.shown() for k, v in report.items()}
        send(control, Control(refused=f"isolation required but missing here: {', '.join(missing)} ({shown})"))
        os._exit(72)
    send(control, Control(layers=report))
    control.settimeout(60)
    if control.recv(1) != b"g":  # the server checked this process from outside before any user code runs
        os._exit(73)
    control.close()


def confine(policy: Policy, control: socket.socket) -> None:
    """Apply every layer in one go (the cold path); returns in the confined process (pid 1 of the call's pid
    namespace). Raises Refused before any namespace; exits the child after telling the server otherwise."""
    isolation.die_with_parent()
    report: dict[str, Layer] = {}
    if not policy.enabled:
        apply_rlimits(policy.limits)
        send(control, Control(pid=os.getpid(), layers={"isolation": Layer(enforced=None, text="off (--no-isolation)")}))
        control.close()
        return
    root = privileged()
    _CONTROL[:] = [control]
    project_tree = None
    if policy.project_dir:  # checked here, before any namespace; cloned before them when privileged
        project_tree, policy.project_dir_real = open_project(policy, clone=root)
    err = isolation.join_cgroups(policy.cgroups)
    report["cgroup"] = _cgroup_layer(policy.cgroup_state, err)

    def tell(pid: int) -> None:
        send(control, Control(pid=pid))

    if root and enter_namespaces(tell):
        report["namespaces"] = Layer.of(True, NS_REPORT)
        report["network"] = Layer.of(True, NET_REPORT_LO if _LOOPBACK[0] else NET_REPORT)
        try:
            ro, mapped = prepare_view(policy, policy.scratch)
            finish_view(policy, policy.scratch, project_tree, ro, mapped, report)
            report["identity"] = Layer.of(True, drop_identity())
            isolation.die_with_parent()  # a uid change clears the parent-death signal: set it again
        except (OSError, Refused) as exc:
            send(control, Control(refused=f"could not build the sandbox: {exc}"))
            os._exit(71)
    elif not root and enter_namespaces(tell, user=True):
        ro = _confine_in_user_namespace(policy, report, control)
    else:
        if project_tree is not None:
            os.close(project_tree)
        send(control, Control(pid=os.getpid()))
        report["namespaces"] = Layer.of(False, "no pid or mount namespace (the server is not root, and no user namespace)")
        report["view"] = Layer.of(False, "no private file-system view (only the call's scratch dir is writable)")
        ok, how = isolation.new_network_namespace()
        report["network"] = Layer.of(ok, how)
        ok, how = isolation.drop_privileges()
        report["identity"] = Layer.of(False, f"same uid as the server ({os.getuid()}); {how}")
        ro = isolation.readable_roots(policy.project_dir_real or policy.scratch, policy.package_root,
                                      python_trees(policy.python))
        os.chdir(policy.scratch)
        lock_down(policy, ro, report, control, private=False)
        return
    lock_down(policy, ro, report, control)


def _confine_in_user_namespace(policy: Policy, report: dict[str, Layer], control: socket.socket) -> list[str]:
    """A server without root, in the call's pid 1 inside its own user namespace: the same view as root builds (the
    project opened and checked again in the new mount namespace, and bound), then every capability dropped."""
    report["namespaces"] = Layer.of(True, NS_REPORT + "; in an unprivileged user namespace")
    report["network"] = Layer.of(True, NET_REPORT_LO if _LOOPBACK[0] else NET_REPORT)
    try:
        project_tree = None
        if policy.project_dir:
            project_tree, policy.project_dir_real = open_project(policy)
        ro, mapped = prepare_view(policy, policy.scratch)
        finish_view(policy, policy.scratch, project_tree, ro, mapped, report)
        ok, how = isolation.drop_privileges()
        if not ok:
            raise OSError(0, how)
        report["identity"] = Layer.of(False, f"same uid as the server ({os.getuid()}), no root to change it; {how}")
        isolation.die_with_parent()
        _libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the server (same uid, no capabilities) checks it from outside
    except (OSError, Refused) as exc:
        send(control, Control(refused=f"could not build the sandbox: {exc}"))
        os._exit(71)
    return ro


def spare(base: Policy, newroot: str, zygote: socket.socket) -> None:
    """A warm call made ahead of time (forked from the warm worker before any job): the call's cgroup joined (the
    worker made it), namespaces entered and the shared part of the view built; it waits for one job, then opens and
    checks the project, finishes the view, drops identity, locks down and runs it. Never returns."""
    try:
        isolation.die_with_parent()
        _libc.prctl(15, b"gp-spare", 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm tells an idle spare from a call
        cgroup_err = isolation.join_cgroups(base.cgroups)  # the group the warm worker made for this call
        if not enter_namespaces(lambda pid: None):
            send(zygote, {"nspid": None, "error": os.strerror(ctypes.get_errno())})
            os._exit(74)
        ro, mapped = prepare_view(base, newroot)
        try:
            send(zygote, {"ready": True})
        except OSError:
            pass
        req, fds = recv_job(zygote)
        _libc.prctl(15, b"gp-call", 0, 0, 0)
        zygote.close()
        out_fd, err_fd, res_fd, ctl_fd = fds
        control = socket.socket(fileno=ctl_fd)
        policy = Policy.model_validate_json(req["policy"])
        report: dict[str, Layer] = {}
        try:
            if any(getattr(policy, k) != getattr(base, k) for k in VIEW_KEYS):
                raise Refused("internal: the spare's view was built for other settings")
            project_tree = None
            if policy.project_dir:
                project_tree, policy.project_dir_real = open_project(policy)
            report["cgroup"] = _cgroup_layer(base.cgroup_state, cgroup_err)
            report["namespaces"] = Layer.of(True, NS_REPORT)
            report["network"] = Layer.of(True, NET_REPORT_LO if _LOOPBACK[0] else NET_REPORT)
            finish_view(policy, newroot, project_tree, ro, mapped, report)
            report["identity"] = Layer.of(True, drop_identity())
            isolation.die_with_parent()
        except (OSError, Refused) as exc:
            send(control, Control(refused=f"could not build the sandbox: {exc}" if isinstance(exc, OSError) else str(exc)))
            os._exit(71)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (devnull, out_fd, err_fd):
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        close_other_fds({0, 1, 2, res_fd, ctl_fd})  # the id-map namespace and anything else of the worker's
        lock_down(policy, ro, report, control)
        from gradprobe.sandbox.child import run

        run(Job.model_validate_json(req["job"]), res_fd)
    finally:
        os._exit(70)


def _cgroup_layer(state: Layer, err: str | None) -> Layer:
    """The call's cgroup: as the server made it (`state`), unless joining it failed."""
    return Layer.of(False, err) if err else state


VIEW_KEYS = ("enabled", "python", "package_root", "extra_ro", "scratch_bytes", "shm_bytes", "devices")


def recv_job(sock: socket.socket) -> tuple[dict, list[int]]:
    buf, fds = b"", []
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("!I", buf[:4])[0]:
        msg, got, _flags, _addr = socket.recv_fds(sock, 1 << 20, 8)
        if not msg:
            os._exit(0)  # the warm worker (or the server holding the job socket) went away before a job came
        buf += msg
        fds += got
    (n,) = struct.unpack("!I", buf[:4])
    return json.loads(buf[4:4 + n]), fds
