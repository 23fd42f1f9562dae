"""The warm worker: imports torch and the model code once, then forks one fresh child per call.

Started by the server as `python -I .../zygote.py FD`, it talks over a Unix socket
(FD): each request carries the job and three pipe ends (stdout, stderr, result) as
SCM_RIGHTS; it hands the job to the spare it made ahead of time (or forks), answers
with the child's pid and the call's cgroup (which it made, in the server's subtree,
and the child already joined; the server tears it down after the reply), and later
reports the child's exit status. The next spare is made while the call runs. Rules that keep forking safe: this process stays single-threaded,
never runs a tensor op (a parent that ran one multi-threaded op deadlocks its
children) and never initialises CUDA (children do, after the fork); it is
non-dumpable, so its children cannot read its memory or environment through /proc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile

if TYPE_CHECKING:
    from gradprobe.sandbox.cgroups import CallCgroup
    from gradprobe.sandbox.protocol import Policy

PRELOAD = (
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation.utils",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.llama.modeling_llama",
    "peft",
)


_WAKE: tuple[int, ...] = ()


def split_frames(buf: bytes) -> tuple[list[dict], bytes]:
    """The complete length-prefixed JSON messages in buf, and the incomplete rest (both ends use this)."""
    msgs = []
    while len(buf) >= 4:
        (n,) = struct.unpack("!I", buf[:4])
        if len(buf) < 4 + n:
            break
        msgs.append(json.loads(buf[4:4 + n]))
        buf = buf[4 + n:]
    return msgs, buf


def send_msg(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _nondumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def preload() -> list[str]:
    import importlib

    import torch  # noqa: F401  (import only: no tensor op, no CUDA)

    import gradprobe.checks.diagnosis  # every check module
    import gradprobe.findings
    import gradprobe.loading  # what a call imports before its check (job.run_job imports them lazily)
    import gradprobe.sandbox.child
    import gradprobe.sandbox.confine
    import gradprobe.sandbox.run_check
    import gradprobe.userframes

    loaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:
            pass
    gradprobe.findings.catalogue()  # parsed from the check modules' source once here, not in every call
    _warm_linecache()
    return loaded


def _warm_linecache() -> None:
    """Source lines of the modules on a call's path, read once here: torch.manual_seed queues its CUDA/XPU seeding
    with a formatted stack (traceback.format_stack) that would otherwise read these files in every call."""
    import linecache

    import torch

    from gradprobe.userframes import is_gradprobe_file

    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and is_gradprobe_file(path):
            linecache.getlines(path)
    torch.manual_seed(0)  # no tensor op, no CUDA init: it reads the seeding path's torch sources into linecache


def child(req: dict, fds: list[int], sock: socket.socket) -> None:
    """In the forked child: confine (confine.py: this process becomes the keeper, its child the call), run the job."""
    try:
        sock.close()
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in _WAKE:
            os.close(fd)
        out_fd, err_fd, res_fd, ctl_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (devnull, out_fd, err_fd):
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        from gradprobe.sandbox import confine
        from gradprobe.sandbox.child import run
        from gradprobe.sandbox.protocol import Control, Job, Policy

        control = socket.socket(fileno=ctl_fd)
        try:
            confine.confine(Policy.model_validate_json(req["policy"]), control)
        except confine.Refused as exc:
            confine.send(control, Control(refused=str(exc)))
            os._exit(71)
        run(Job.model_validate_json(req["job"]), res_fd)
    finally:
        os._exit(70)


class Spare:
    """A call forked and half-confined ahead of time (confine.spare), waiting for its job on `sock`."""

    def __init__(self, base: Policy, server: socket.socket):
        from gradprobe.sandbox import confine

        self.base = {k: getattr(base, k) for k in confine.VIEW_KEYS + ("cgroup_spec",)}
        self.cgroup = _cgroup_for(base)  # made and joined now: the call finds itself in it
        if self.cgroup is not None:
            base = base.model_copy(update=_joined(self.cgroup))
        self.root = tempfile.mkdtemp(prefix="gradprobe-root-", dir="/tmp")
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                server.close()
                self.sock.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in _WAKE:
                    os.close(fd)
                confine.spare(base, self.root, theirs)
            finally:
                os._exit(70)
        theirs.close()

    def fits(self, policy: Policy) -> bool:
        return all(getattr(policy, k) == v for k, v in self.base.items())

    def hand(self, req: dict, fds: list[int]) -> None:
        data = json.dumps(req).encode()
        socket.send_fds(self.sock, [struct.pack("!I", len(data)) + data], fds)

    def drop(self) -> None:
        self.sock.close()  # the spare reads EOF and exits


def _cgroup_for(policy: Policy) -> CallCgroup | None:
    """The call's cgroup, made in the server's subtree with the limits the server asked for (None with isolation off)."""
    spec = policy.cgroup_spec
    if not policy.enabled or spec is None:
        return None
    from gradprobe.sandbox.cgroups import CallCgroup

    return CallCgroup(spec.memory_bytes, spec.pids or 512, server=spec.server)


def _joined(group: CallCgroup) -> dict[str, Any]:
    """The policy's fields for a call that joins `group`."""
    from gradprobe.sandbox.runner import cgroup_layer

    return {"cgroups": group.procs_files if group.ok else [], "cgroup_state": cgroup_layer(group)}


def _spares_possible(policy: Policy) -> bool:
    return policy.enabled and os.geteuid() == 0


def _new_spare(policy: Policy, sock: socket.socket, roots: dict, groups: dict) -> Spare:
    spare = Spare(policy, sock)
    roots[spare.pid] = spare.root
    if spare.cgroup is not None:
        groups[spare.pid] = spare.cgroup
        send_msg(sock, {"spare_cgroup": spare.cgroup.state()})  # the server removes it if this worker dies first
    return spare


def serve(sock: socket.socket) -> None:
    from gradprobe.sandbox.protocol import Policy

    buf = b""
    pending: list[int] = []  # fds that arrived with a request not yet complete
    forked: set[int] = set()
    roots: dict[int, str] = {}  # a spare's keeper pid -> its (empty) mount point on the host
    groups: dict[int, Any] = {}  # a spare's keeper pid -> its cgroup, removed here if it dies without a call
    stale: list[Any] = []  # such cgroups not yet empty
    spare: Spare | None = None
    global _WAKE
    wake_r, wake_w = _WAKE = os.pipe()  # SIGCHLD wakes select at once: exits are reported without polling delay
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        while True:  # report finished children
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if pid in forked:  # else an orphan of a call, reaped here as its subreaper
                forked.discard(pid)
                send_msg(sock, {"exit": pid, "code": code})
            if pid in roots:
                try:
                    os.rmdir(roots.pop(pid))
                except OSError:
                    pass
            if pid in groups:
                stale.append(groups.pop(pid))
            if spare is not None and pid == spare.pid:
                spare.drop()
                spare = None
        for group in list(stale):  # never blocks: one try each time round
            group.kill_now()
            group.remove(tries=1)
            if not group.dirs:
                stale.remove(group)
        watch: list[Any] = [sock, wake_r] + ([spare.sock] if spare is not None else [])
        ready, _, _ = select.select(watch, [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if spare is not None and spare.sock in ready and not spare.sock.recv(4096):
            spare.drop()  # it died before its job (it said why on stderr, which is /dev/null here)
            spare = None
        if sock not in ready:
            continue
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 24)
        if not msg:
            if spare is not None:
                spare.drop()
            return  # the server went away
        buf += msg
        pending += fds
        reqs, buf = split_frames(buf)
        for req in reqs:
            these, pending = pending[:4], pending[4:]
            policy = Policy.model_validate_json(req["policy"])
            if _spares_possible(policy):
                if spare is not None and not spare.fits(policy):
                    spare.drop()
                    spare = None
                if spare is None:
                    spare = _new_spare(policy, sock, roots, groups)
                spare.hand(req, these)
                pid, group = spare.pid, groups.pop(spare.pid, None)  # the call's now: the server tears it down
                spare.drop()
                spare = None
            else:
                group = _cgroup_for(policy)
                if group is not None:
                    req["policy"] = policy.model_copy(update=_joined(group)).model_dump_json()
                pid = os.fork()
                if pid == 0:
                    child(req, these, sock)
            forked.add(pid)
            for fd in these:
                os.close(fd)
            send_msg(sock, {"forked": req["id"], "pid": pid, "cgroup": group.state() if group is not None else None})
            if _spares_possible(policy) and not pending:  # the next call's, made while this one runs (it must
                spare = _new_spare(policy, sock, roots, groups)  # not inherit this call's pipes: made after closing them)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.path.insert(0, root)
    sock = socket.socket(fileno=int(sys.argv[1]))
    _nondumpable()
    from gradprobe.sandbox import isolation

    isolation.become_subreaper()
    if os.geteuid() == 0:
        from gradprobe.sandbox import confine

        confine.IDMAP_FD = confine.make_idmap_userns()  # made once; every forked call inherits it
    loaded = preload()
    import gc

    gc.collect()
    gc.freeze()  # children's GC passes then skip the preloaded objects: no copy-on-write storm per call
    send_msg(sock, {"ready": True, "preloaded": loaded, "pid": os.getpid()})
    serve(sock)


if __name__ == "__main__":
    main()
