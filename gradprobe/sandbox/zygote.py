"""The warm worker: imports torch and the model code once, then forks one fresh child per call.

Started by the server as `python -I .../zygote.py FD`, it talks over a Unix socket
(FD): each request carries the job and three pipe ends (stdout, stderr, result) as
SCM_RIGHTS; it forks, answers with the child's pid, and later reports the child's
exit status. Rules that keep forking safe: this process stays single-threaded,
never runs a tensor op (a parent that ran one multi-threaded op deadlocks its
children) and never initialises CUDA (children do, after the fork); it is
non-dumpable, so its children cannot read its memory or environment through /proc.
"""

from __future__ import annotations

from typing import Any

import json
import os
import select
import signal
import socket
import struct
import sys

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

    import gradprobe.checks.diagnosis
    import gradprobe.sandbox.job  # noqa: F401

    loaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:
            pass
    return loaded


def child(req: dict, fds: list[int], sock: socket.socket) -> None:
    """In the forked child: become the sandboxed call."""
    try:
        sock.close()
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in _WAKE:
            os.close(fd)
        out_fd, err_fd, res_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (devnull, out_fd, err_fd):
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        from gradprobe.sandbox.child import run

        run(req["job"], res_fd)
    finally:
        os._exit(70)


def serve(sock: socket.socket) -> None:
    buf = b""
    pending: list[int] = []  # fds that arrived with a request not yet complete
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
            send_msg(sock, {"exit": pid, "code": code})
        watched: list[Any] = [sock, wake_r]
        ready, _, _ = select.select(watched, [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if sock not in ready:
            continue
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 24)
        if not msg:
            return  # the server went away
        buf += msg
        pending += fds
        reqs, buf = split_frames(buf)
        for req in reqs:
            these, pending = pending[:3], pending[3:]
            pid = os.fork()
            if pid == 0:
                child(req, these, sock)
            for fd in these:
                os.close(fd)
            send_msg(sock, {"forked": req["id"], "pid": pid})


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.path.insert(0, root)
    sock = socket.socket(fileno=int(sys.argv[1]))
    _nondumpable()
    loaded = preload()
    import gc

    gc.collect()
    gc.freeze()  # children's GC passes then skip the preloaded objects: no copy-on-write storm per call
    send_msg(sock, {"ready": True, "preloaded": loaded, "pid": os.getpid()})
    serve(sock)


if __name__ == "__main__":
    main()
