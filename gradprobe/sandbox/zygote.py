"""The warm worker: imports torch and the model code once, then forks one fresh child per call.

Started by the server as `python -I .../zygote.py FD`, it is a small fork server that
never sees a job: over its Unix socket (FD) the server asks only for "a child for these
base settings" (the view and cgroup settings every call of this server shares, nothing
of any request: no target, setup code, script args, environment or project path). It
answers with the child's pid, the call's cgroup (which it made, in the server's subtree,
and the child already joined; the server tears it down after the reply) and, as
SCM_RIGHTS, the child's own job socket: the server sends the job and the call's pipes
to that child alone, so no later fork can inherit a request in its memory. It later
reports the child's exit status. The next spare (a child forked and half-confined
ahead of time, that never held a job) is made while the call runs and passed to the
server the same way at once: the server holds it and sends the next call's job straight
to it (then asks here for the one after), so a call waits on no round trip through this
process. Rules that keep forking safe: this process
stays single-threaded, never runs a tensor op (a parent that ran one multi-threaded op
deadlocks its children) and never initialises CUDA (children do, after the fork); it is
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


# gradprobe's own modules a call imports lazily (run_check, loading, the checks, script mode): imported here once,
# not in every call (measured: ~10-20 ms of a warm call went to importing these after the fork)
OWN_LAZY = (
    "gradprobe.sandbox.interpreter",  # child.unusable_interpreter's bounds
    "gradprobe.frameworks",
    "gradprobe.checks.steps.diagnose_steps",
    "gradprobe.checks.steps.partners",
    "gradprobe.sandbox.failures",
    "gradprobe.scriptmode.run",
    "gradprobe.scriptmode.first_step",
    "gradprobe.scriptmode.amp",
    "gradprobe.scriptmode.observe",
    "gradprobe.scriptmode.modelranks",
    "gradprobe.scriptmode.ranks",
    "gradprobe.scriptmode.rankwatch",
    "gradprobe.scriptmode.step",
    "gradprobe.sharded",
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
    for name in OWN_LAZY + PRELOAD:
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


def pretouch() -> None:
    """Run in a spare before its job: set again, to the very same value, an attribute of each torch class that a
    call patches while it loads the model or observes a step (loading.py, checks/steps/observe.py). Setting an
    attribute on a class rewrites every subclass's type object (slots, method-cache tags): hundreds of classes
    once transformers is preloaded, each a copy-on-write page fault in a forked process. Done here, those pages
    are the spare's own before the job arrives; nothing changes but where the copying happens."""
    import torch
    from torch import nn
    from torch.optim import lr_scheduler

    owners: list[tuple[Any, str]] = [(nn.Module, "__setattr__"), (torch.Tensor, "register_hook"),
                                     (torch.optim.Optimizer, "__init__"), (lr_scheduler.LRScheduler, "step"),
                                     (torch.autograd.grad_mode.set_grad_enabled, "__init__")]
    for owner, name in owners:
        try:
            setattr(owner, name, owner.__dict__[name])
        except (KeyError, TypeError, AttributeError):
            pass


def send_msg(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def _forked_setup() -> None:
    """First steps of every forked child: nothing of the worker's loop (wake-up pipe, SIGCHLD handler) stays."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in _WAKE:
        os.close(fd)


def child(req: dict, fds: list[int]) -> None:
    """In a plain child (no spare: a non-root server, or isolation off), once its job came: confine (confine.py: this
    process becomes the keeper, its child the call), run the job."""
    try:
        os.setsid()
        out_fd, err_fd, res_fd, ctl_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (devnull, out_fd, err_fd):
            os.close(fd)
        from gradprobe.sandbox import confine
        from gradprobe.sandbox.child import run
        from gradprobe.sandbox.protocol import Control, Job, Policy

        confine.close_other_fds({0, 1, 2, res_fd, ctl_fd})  # nothing of the worker's reaches the user's code
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        control = socket.socket(fileno=ctl_fd)
        try:
            confine.confine(Policy.model_validate_json(req["policy"]), control)
        except confine.Refused as exc:
            confine.send(control, Control(refused=str(exc)))
            os._exit(71)
        run(Job.model_validate_json(req["job"]), res_fd)
    finally:
        os._exit(70)


def _plain(base: Policy, jobs: socket.socket) -> None:
    from gradprobe.sandbox import confine
    from gradprobe.sandbox.protocol import Policy

    req, fds = confine.recv_job(jobs)
    jobs.close()
    if len(fds) != 4 or not isinstance(req.get("policy"), str):
        os._exit(75)
    policy = Policy.model_validate_json(req["policy"])
    req["policy"] = policy.model_copy(update={"cgroups": base.cgroups, "cgroup_state": base.cgroup_state}).model_dump_json()
    child(req, fds)


class Spare:
    """A child forked for the next call before its job exists: half-confined ahead of time on a root server
    (confine.spare), else plain (`_plain`); either way it waits for its job on its own socket, which the server
    gets (`job_fd`, passed as soon as the spare is made) and writes the job to directly."""

    def __init__(self, base: Policy, server: socket.socket):
        from gradprobe.sandbox import confine

        self.base = base
        self.ahead = _spares_possible(base)
        self.cgroup = _cgroup_for(base)  # made and joined now: the call finds itself in it
        if self.cgroup is not None:
            base = base.model_copy(update=_joined(self.cgroup))
        self.root = tempfile.mkdtemp(prefix="gradprobe-root-", dir="/tmp") if self.ahead else None
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                server.close()
                self.sock.close()
                _forked_setup()
                if self.root is not None:
                    confine.spare(base, self.root, theirs, pretouch)
                else:
                    _plain(base, theirs)
            finally:
                os._exit(70)
        theirs.close()

    def drop(self) -> None:
        self.sock.close()  # the spare reads EOF and exits (or, handed over, the server holds the other copy)


BASE_KEYS = ("enabled", "python", "package_root", "extra_ro", "scratch_bytes", "shm_bytes", "devices", "cgroup_spec")


def base_policy(policy: Policy) -> Policy:
    """What the warm worker sees of a call's policy: the settings every call of this server shares (BASE_KEYS)."""
    return type(policy)(**{k: getattr(policy, k) for k in BASE_KEYS})


def _cgroup_for(policy: Policy) -> CallCgroup | None:
    """The call's cgroup, made in the server's subtree with the limits the server asked for (None with isolation off)."""
    spec = policy.cgroup_spec
    if not policy.enabled or spec is None:
        return None
    from gradprobe.sandbox.cgroups import CallCgroup

    return CallCgroup(spec.memory_bytes, spec.pids or 512, server=spec.server, parents=spec.parents or None)


def _joined(group: CallCgroup) -> dict[str, Any]:
    """The policy's fields for a call that joins `group`."""
    from gradprobe.sandbox.cgroups import cgroup_layer

    return {"cgroups": group.procs_files if group.ok else [], "cgroup_state": cgroup_layer(group)}


def _spares_possible(policy: Policy) -> bool:
    from gradprobe.sandbox.confine import privileged

    return policy.enabled and privileged()


def _new_spare(base: Policy, sock: socket.socket, roots: dict[int, str], groups: dict[int, Any]) -> Spare:
    spare = Spare(base, sock)
    if spare.root is not None:
        roots[spare.pid] = spare.root
    if spare.cgroup is not None:
        groups[spare.pid] = spare.cgroup
        send_msg(sock, {"spare_cgroup": spare.cgroup.state()})  # the server removes it if this worker dies first
    return spare


class _Worker:
    """The fork server's state: children it forked (each passed to the server), their mount points and cgroups."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.forked: set[int] = set()
        self.roots: dict[int, str] = {}  # a spare's keeper pid -> its (empty) mount point on the host
        self.groups: dict[int, Any] = {}  # a spare's keeper pid -> its cgroup, removed here if it dies without a call
        self.stale: list[Any] = []  # such cgroups not yet empty

    def reap(self) -> None:
        """Report finished children; remove what spares that died without a call leave."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if pid in self.forked:  # else an orphan of a call, reaped here as its subreaper
                self.forked.discard(pid)
                send_msg(self.sock, {"exit": pid, "code": code})
            if pid in self.roots:
                try:
                    os.rmdir(self.roots.pop(pid))
                except OSError:
                    pass
            if pid in self.groups:
                self.stale.append(self.groups.pop(pid))
        for group in list(self.stale):  # never blocks: one try each time round
            group.kill_now()
            group.remove(tries=1)
            if not group.dirs:
                self.stale.remove(group)

    def give(self, req: dict) -> None:
        """Answer one request: a child for these base settings, its job socket passed to the server ("forked"); or
        ("next", sent once a call's job is on its way) the next call's spare, passed the same way ("spare"), which the server
        holds for its next call with these settings: that job then goes to it without a round trip through here."""
        from gradprobe.sandbox.protocol import Policy

        base = base_policy(Policy.model_validate_json(req["base"]))  # (base_policy: nothing else even if sent)
        if not req.get("next"):
            self._hand(_new_spare(base, self.sock, self.roots, self.groups), {"forked": req.get("id")})
        elif _spares_possible(base):
            self._hand(_new_spare(base, self.sock, self.roots, self.groups), {"spare": req["base"]})
        else:
            send_msg(self.sock, {"no_spare": req.get("id")})  # a plain child could not wait half-confined

    def _hand(self, spare: Spare, head: dict[str, Any]) -> None:
        """Pass a child that never held a job to the server (its job socket, as SCM_RIGHTS); its exit is reported."""
        group = self.groups.pop(spare.pid, None)  # the server's now: it tears it down
        self.forked.add(spare.pid)
        send_msg(self.sock, {**head, "pid": spare.pid, "cgroup": group.state() if group is not None else None},
                 [spare.sock.fileno()])
        spare.drop()


def serve(sock: socket.socket) -> None:
    buf = b""
    worker = _Worker(sock)
    global _WAKE
    wake_r, wake_w = _WAKE = os.pipe()  # SIGCHLD wakes select at once: exits are reported without polling delay
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        worker.reap()
        watch: list[Any] = [sock, wake_r]
        ready, _, _ = select.select(watch, [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if sock not in ready:
            continue
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 8)
        for fd in fds:  # requests carry no descriptors
            os.close(fd)
        if not msg:
            return  # the server went away
        buf += msg
        reqs, buf = split_frames(buf)
        for req in reqs:
            worker.give(req)


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
        from gradprobe.sandbox import view

        view.IDMAP_FD = view.make_idmap_userns()  # made once; every forked call inherits it
    loaded = preload()
    import gc

    gc.collect()
    gc.freeze()  # children's GC passes then skip the preloaded objects: no copy-on-write storm per call
    send_msg(sock, {"ready": True, "preloaded": loaded, "pid": os.getpid()})
    serve(sock)


if __name__ == "__main__":
    main()
