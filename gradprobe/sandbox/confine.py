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
from collections.abc import Callable
from typing import Any

from gradprobe.sandbox import isolation
from gradprobe.sandbox.protocol import ChildLimits, Control, Job, Layer, Policy
from gradprobe.sandbox.view import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    DEV_NODES,
    NOBODY,
    Refused,
    _check,
    _libc,
    clone_python_trees,
    finish_view,
    open_project,
    open_read_paths,
    prepare_view,
    privileged,
    python_trees,
)


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
    reads = open_read_paths(policy, clone=root)
    err = isolation.join_cgroups(policy.cgroups)
    report["cgroup"] = _cgroup_layer(policy.cgroup_state, err)
    opened = clone_python_trees(policy) if root else {}

    def tell(pid: int) -> None:
        send(control, Control(pid=pid))

    if root and enter_namespaces(tell):
        report["namespaces"] = Layer.of(True, NS_REPORT)
        report["network"] = Layer.of(True, NET_REPORT_LO if _LOOPBACK[0] else NET_REPORT)
        try:
            ro, mapped = prepare_view(policy, policy.scratch, opened)
            finish_view(policy, policy.scratch, project_tree, ro, mapped, report, reads)
            report["identity"] = Layer.of(True, drop_identity())
            isolation.die_with_parent()  # a uid change clears the parent-death signal: set it again
        except (OSError, Refused) as exc:
            send(control, Control(refused=f"could not build the sandbox: {exc}"))
            os._exit(71)
    elif not root and enter_namespaces(tell, user=True):
        ro = _confine_in_user_namespace(policy, report, control, reads)
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
                                      python_trees(policy) + [real for real, _ in reads])
        os.chdir(policy.scratch)
        lock_down(policy, ro, report, control, private=False)
        return
    lock_down(policy, ro, report, control)


def _confine_in_user_namespace(policy: Policy, report: dict[str, Layer], control: socket.socket,
                               reads: list[tuple[str, int]]) -> list[str]:
    """A server without root, in the call's pid 1 inside its own user namespace: the same view as root builds (the
    project opened and checked again in the new mount namespace, and bound), then every capability dropped."""
    report["namespaces"] = Layer.of(True, NS_REPORT + "; in an unprivileged user namespace")
    report["network"] = Layer.of(True, NET_REPORT_LO if _LOOPBACK[0] else NET_REPORT)
    try:
        project_tree = None
        if policy.project_dir:
            project_tree, policy.project_dir_real = open_project(policy)
        ro, mapped = prepare_view(policy, policy.scratch)
        finish_view(policy, policy.scratch, project_tree, ro, mapped, report, reads)
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


def spare(base: Policy, newroot: str, zygote: socket.socket, prepare: Callable[[], None] | None = None) -> None:
    """A warm call made ahead of time (forked from the warm worker before any job): the call's cgroup joined (the
    worker made it), namespaces entered, the shared part of the view built and `prepare` run (what every call
    would do first, nothing of a job); it waits for one job, then opens and checks the project, finishes the
    view, drops identity, locks down and runs it. Never returns."""
    try:
        isolation.die_with_parent()
        _libc.prctl(15, b"gp-spare", 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm tells an idle spare from a call
        cgroup_err = isolation.join_cgroups(base.cgroups)  # the group the warm worker made for this call
        if not enter_namespaces(lambda pid: None):
            send(zygote, {"nspid": None, "error": os.strerror(ctypes.get_errno())})
            os._exit(74)
        ro, mapped = prepare_view(base, newroot)
        if prepare is not None:
            prepare()
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
            reads = open_read_paths(policy)
            report["cgroup"] = _cgroup_layer(base.cgroup_state, cgroup_err)
            report["namespaces"] = Layer.of(True, NS_REPORT)
            report["network"] = Layer.of(True, NET_REPORT_LO if _LOOPBACK[0] else NET_REPORT)
            finish_view(policy, newroot, project_tree, ro, mapped, report, reads)
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
