"""Server side of the warm worker: start it, ask it to fork a child per call, learn how children exit.

A call then costs a fork (milliseconds) instead of importing torch and
transformers (seconds). If the worker dies it is restarted on the next call; if
it cannot start, calls fall back to a cold child and the report says so.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

from gradprobe.sandbox.protocol import Job, Policy
from gradprobe.sandbox.zygote import base_policy, split_frames

ZYGOTE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "zygote.py")  # the real path: the view binds it
START_TIMEOUT_S = 120.0
# spares kept ahead: a spare takes two forks of the worker, new namespaces and the shared view (tens of ms, more on a
# busy machine); with two in the pipeline the next call's was started a whole call earlier and is ready when it comes
SPARES = 2


@dataclass
class _Held:
    """A spare the worker passed ahead of time: its base settings (JSON), pid, cgroup state and job socket."""

    base: str
    pid: int
    cgroup: dict[str, Any] | None
    job_fd: int | None


class WarmWorker:
    """One zygote process; thread-safe to use from the server's event loop."""

    def __init__(self, env: dict):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.info: dict = {}
        self.error: str | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._forked: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self._early_exits: dict[int, int] = {}
        self._spare_groups: dict[str, dict] = {}  # cgroups the worker made for spares not yet handed a call
        self._held: collections.deque[_Held] = collections.deque()  # spares the worker passed ahead, oldest first
        self._unused: dict[int, dict] = {}  # pid -> cgroup of a spare let go without a job: removed once it exits
        self._base: str | None = None  # the base settings of the last call: what the next spare is made for
        self._asked = 0  # spares asked for and not here yet
        self._coming: asyncio.Future[None] | None = None  # set when the next spare arrives (a call waits on it)
        self._spares = True  # False once the worker said it cannot make spares (a plain child cannot wait confined)
        self._ready: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    @property
    def alive(self) -> bool:
        """Running and ready: it has imported torch and the model code (what /health reports as the warm worker)."""
        return self.proc is not None and self.proc.poll() is None and self.sock is not None and bool(self.info.get("ready"))

    async def ensure(self) -> bool:
        """Start the worker if needed; False (with self.error set) when it cannot run."""
        if self.alive:
            return True
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self.alive:
                return True
            try:
                await asyncio.wait_for(self._start(), START_TIMEOUT_S)
                self.error = None
                return True
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                self.stop()
                return False

    async def _start(self) -> None:
        self.stop()
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ready = self._loop.create_future()
        self._spares, self._base, self._asked = True, None, 0
        self.proc = subprocess.Popen(
            [sys.executable, "-I", ZYGOTE, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=self.env, start_new_session=True, cwd=self.env.get("HOME", "/"),
        )
        theirs.close()
        self.sock = ours
        threading.Thread(target=self._reader, args=(ours, self.proc), daemon=True, name="gradprobe-warm-reader").start()
        self.info = await self._ready

    def _reader(self, sock: socket.socket, proc: subprocess.Popen) -> None:
        loop = self._loop
        assert loop is not None  # set by _start before the reader thread runs
        buf = b""
        fds: list[int] = []  # job sockets of forked children, in the order of their "forked" messages
        while True:
            try:
                chunk, got, _flags, _addr = socket.recv_fds(sock, 65536, 4)
            except OSError:
                chunk, got = b"", []
            for fd in got:  # a spare's job socket may be held across calls: no program this server starts inherits it
                os.set_inheritable(fd, False)
            fds += got
            if not chunk:
                break
            buf += chunk
            msgs, buf = split_frames(buf)
            for msg in msgs:
                if "forked" in msg or "spare" in msg:
                    msg["job_fd"] = fds.pop(0) if fds else None
                loop.call_soon_threadsafe(self._dispatch, msg)
        for fd in fds:
            os.close(fd)
        loop.call_soon_threadsafe(self._died, proc)

    def _dispatch(self, msg: dict) -> None:
        if msg.get("ready") and self._ready is not None and not self._ready.done():
            self._ready.set_result(msg)
        elif isinstance(msg.get("spare_cgroup"), dict):
            self._spare_groups[str(msg["spare_cgroup"].get("name"))] = msg["spare_cgroup"]
        elif "spare" in msg or "no_spare" in msg:
            self._spares = "spare" in msg
            self._asked = max(0, self._asked - 1)
            if "spare" in msg:
                self._held.append(_Held(str(msg["spare"]), msg["pid"], msg.get("cgroup"), msg.get("job_fd")))
                while len(self._held) > SPARES:
                    self._let_go(self._held.popleft())
            if self._coming is not None and not self._coming.done():
                self._coming.set_result(None)
        elif "forked" in msg:
            self._spare_groups.pop(str((msg.get("cgroup") or {}).get("name")), None)  # the call's now: its caller's
            fut = self._forked.pop(msg["forked"], None)
            if fut is not None and not fut.done():
                fut.set_result((msg["pid"], msg.get("cgroup"), msg.get("job_fd")))
            elif msg.get("job_fd") is not None:
                os.close(msg["job_fd"])  # its call gave up waiting: the child reads EOF and exits
        elif "exit" in msg:
            pid = msg["exit"]
            for held in [h for h in self._held if h.pid == pid]:  # a held spare died before any job
                self._held.remove(held)
                self._let_go(held)
            if pid in self._unused:
                self._remove_group(self._unused.pop(pid))
                return
            fut = self._exits.pop(pid, None)
            if fut is not None and not fut.done():
                fut.set_result(msg["code"])
            else:
                self._early_exits[pid] = msg["code"]

    def _let_go(self, held: _Held | None) -> None:
        """A held spare no call will use (other settings, a newer one, it died): close its job socket (it reads EOF
        and exits); its cgroup goes once it has exited."""
        if held is None:
            return
        if held.job_fd is not None:
            os.close(held.job_fd)
            held.job_fd = None
        if held.cgroup:
            self._spare_groups.pop(str(held.cgroup.get("name")), None)
            self._unused[held.pid] = held.cgroup

    def _remove_group(self, state: dict) -> None:
        self._spare_groups[str(state.get("name"))] = state
        self._remove_spare_groups(only=str(state.get("name")))

    def _died(self, proc: subprocess.Popen) -> None:
        err = RuntimeError("the warm worker exited")
        for fut in list(self._forked.values()) + list(self._exits.values()):
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # retrieved: a call that stopped waiting for it must not log a warning
        self._forked.clear()
        self._exits.clear()
        self._let_go_all()
        self._spare_groups.update({str(g.get("name")): g for g in self._unused.values()})
        self._unused.clear()
        self._asked = 0
        if self._coming is not None and not self._coming.done():
            self._coming.set_result(None)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(err)
        if proc is self.proc:
            self.info = {}
        self._remove_spare_groups()

    def _remove_spare_groups(self, wait: bool = False, only: str | None = None) -> None:
        """The cgroups of spares that died with the worker (it removes those of spares that die while it lives), or
        the one named `only`."""
        if only is not None:
            groups = [self._spare_groups.pop(only)] if only in self._spare_groups else []
        else:
            groups, self._spare_groups = list(self._spare_groups.values()), {}
        if groups:
            from gradprobe.sandbox.cgroups import CallCgroup

            def work() -> None:
                for state in groups:
                    group = CallCgroup.adopt(state)
                    group.kill()
                    group.remove()

            if wait:
                work()
            else:
                threading.Thread(target=work, daemon=True, name="gradprobe-spare-groups").start()

    async def fork(self, job: Job, cwd: str, env: dict[str, str], fds: tuple[int, ...],
                   policy: Policy) -> tuple[int, asyncio.Future[int], dict[str, Any] | None]:
        """Fork a child for `job` with stdout/stderr/result/control on `fds`, confined by `policy` (confine.py);
        returns (pid, future of its exit code, the state of the call's cgroup that the worker made and the child
        joined, for CallCgroup.adopt: the caller tears it down). The worker sees only the base settings (BASE_KEYS):
        the job, its environment and its pipes go from here to the child alone, on the child's own socket."""
        rid = next(self._ids)
        loop = self._loop
        assert loop is not None and self.sock is not None, "fork() on a worker that was never started"
        base = self._base = base_policy(policy).model_dump_json()
        for other in [h for h in self._held if h.base != base]:  # made for other settings: no call of ours takes them
            self._held.remove(other)
            self._let_go(other)
        if not self._held and self._asked:  # being made: sooner than another one
            self._coming = loop.create_future()
            await asyncio.wait_for(asyncio.shield(self._coming), 30)
        held = self._held.popleft() if self._held else None
        if held is not None and held.base == base and held.job_fd is not None:  # the job goes to this spare now
            pid, cgroup, job_fd = held.pid, held.cgroup, held.job_fd
            self._spare_groups.pop(str((cgroup or {}).get("name")), None)  # the call's now: its caller's
        else:
            self._let_go(held)
            fut = loop.create_future()
            self._forked[rid] = fut
            self._send({"id": rid, "base": base})
            pid, cgroup, job_fd = await asyncio.wait_for(fut, 30)
        exit_fut = loop.create_future()
        if pid in self._early_exits:
            exit_fut.set_result(self._early_exits.pop(pid))
        else:
            self._exits[pid] = exit_fut
        if job_fd is None:
            raise RuntimeError("the warm worker sent no job socket")
        data = json.dumps({"job": job.model_dump_json(), "cwd": cwd, "env": env, "policy": policy.model_dump_json()}).encode()
        frame = struct.pack("!I", len(data)) + data
        try:
            with socket.socket(fileno=job_fd) as jobs:
                socket.send_fds(jobs, [frame[:4]], list(fds))  # the pipes travel with the frame's first bytes
                jobs.setblocking(False)
                await loop.sock_sendall(jobs, frame[4:])
        except OSError:
            if cgroup:  # the child died before its job: its cgroup is nobody's call
                self._remove_group(cgroup)
            raise
        finally:
            self._ask_next()
        return pid, exit_fut, cgroup

    def _ask_next(self) -> None:
        """Ask the worker for the next call's spare (made while this call runs: asked for only once this call's
        job is sent, so it never delays it), unless one is held or coming."""
        while (self._base is not None and len(self._held) + self._asked < SPARES and self._loop is not None
               and self.alive and self._spares):
            try:
                self._send({"id": next(self._ids), "base": self._base, "next": True})
            except OSError:  # the worker is gone: the next call starts it again
                return
            self._asked += 1

    def _send(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        assert self.sock is not None
        with self._lock:
            self.sock.sendall(struct.pack("!I", len(data)) + data)

    def _let_go_all(self) -> None:
        while self._held:
            self._let_go(self._held.popleft())

    def stop(self) -> None:
        self._let_go_all()
        self._spare_groups.update({str(g.get("name")): g for g in self._unused.values()})
        self._unused.clear()
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait(timeout=5)
        self.proc = None
        self.info = {}
        self._remove_spare_groups(wait=True)
