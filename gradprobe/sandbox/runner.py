"""Parent side of the process boundary: start a child per call, limit it, stream progress, kill it.

The server never imports torch or user code; it only starts
`gradprobe/sandbox/child.py` with a scrubbed environment, a scratch HOME/cwd,
rlimits, a wall-clock timeout and its own process group, and reads the protocol's
messages (protocol.py: Control on the control socket, Progress and Result on a
dedicated pipe). Whatever the child does (crash, hang, exit, flood its output,
forge lines), the call ends with a report or a clear error.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal


from gradprobe.render import clean
from gradprobe.sandbox.cgroup_tree import placement
from gradprobe.sandbox.cgroups import CallCgroup, cgroup_layer, server_dir_name
from gradprobe.sandbox.interpreter import Interpreter, InterpreterError, resolve
from gradprobe.sandbox.isolation import become_subreaper
from gradprobe.sandbox.protocol import (CHILD_MESSAGE, ChildLimits, CgroupSpec, Control, Job, Layer, Phase, Policy,
                                        Progress, Result, StartFailed, ToolError, shown)
from gradprobe.sandbox.verify import Verified, verify

if TYPE_CHECKING:
    from gradprobe.sandbox.warm import WarmWorker

CHILD = os.path.join(os.path.dirname(os.path.realpath(__file__)), "child.py")  # real paths: the view binds those
LAUNCH = os.path.join(os.path.dirname(os.path.realpath(__file__)), "launch.py")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
OUTPUT_CAP = 64 * 1024
RESULT_CAP = 8 * 1024 * 1024
SETUP_S = 60.0  # before a call's timeout starts: confinement, the server's checks, a cold child importing torch
PROGRESS_CAP, PHASE_CAP = 64, 16  # progress events, and distinct phases, one call may send
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

ProgressFn = Callable[[str, float | None], Awaitable[None]]


@dataclass
class Limits:
    memory_bytes: int | None = 8 * 1024**3
    cpu_seconds: int | None = None
    file_bytes: int = 256 * 1024**2
    open_files: int = 1024
    pids: int = 512
    grace_s: float = 2.0
    isolate: bool = True  # namespaces, Landlock, capabilities, cgroups where the machine allows
    require_isolation: bool = False  # refuse to run user code when a layer is missing
    scratch_bytes: int = 1024**3  # private tmpfs /tmp (holds the call's scratch dir)
    shm_bytes: int = 512 * 1024**2  # private tmpfs /dev/shm

    def for_child(self, timeout_s: float, device: str) -> ChildLimits:
        gpu = device.startswith("cuda") or device == "auto"
        return ChildLimits(
            # CUDA reserves huge virtual ranges: RLIMIT_AS only on CPU runs
            memory_bytes=None if gpu else self.memory_bytes,
            cpu_seconds=self.cpu_seconds or int(timeout_s * 2 + 30),
            file_bytes=self.file_bytes,
            open_files=self.open_files,
        )


@dataclass
class CappedStream:
    """Keeps the head and tail of a stream, counting what was dropped."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def feed(self, data: bytes) -> None:
        room = OUTPUT_CAP // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > OUTPUT_CAP // 2:
                cut = len(self.tail) - OUTPUT_CAP // 2
                self.dropped += cut
                del self.tail[:cut]

    def text(self) -> str:
        mid = f"\n[... {self.dropped} bytes dropped ...]\n" if self.dropped else ""
        return (bytes(self.head).decode("utf-8", "replace") + mid + bytes(self.tail).decode("utf-8", "replace"))


def child_env(scratch: str) -> dict[str, str]:
    """An allow-list environment: no tokens, keys or proxies of the server reach the child."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update(
        HOME=scratch, TMPDIR=scratch, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.setdefault("PATH", "/usr/bin:/bin")
    return env


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _drain(stream: asyncio.StreamReader | None, sink: CappedStream) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        sink.feed(chunk)


@dataclass
class ChildOutcome:
    report: dict[str, Any] | None
    tool_error: str | None
    phase: Phase | str
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float
    events: list[str] = field(default_factory=list)
    mode: str = "cold"
    note: str | None = None
    oom: bool = False
    isolation: dict[str, Any] = field(default_factory=dict)
    # what the tool_error is about: the caller's arguments, or the interpreter the target named
    tool_error_kind: Literal["caller", "interpreter"] = "caller"
    start_error: str | None = None  # launch.py could not execute the target's interpreter


async def _reader_for(fd: int, limit: int = RESULT_CAP) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    return reader, transport


async def _launch_cold(job: Job, python: Interpreter | None, scratch: str, env: dict[str, str], fds: tuple[int, ...],
                       policy: Policy) -> tuple[int, asyncio.Future[int]]:
    out_w, err_w, res_w, ctl = fds
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", LAUNCH, str(ctl), policy.model_dump_json(), python.real if python else sys.executable, CHILD,
        stdin=asyncio.subprocess.PIPE, stdout=out_w, stderr=err_w, cwd=scratch, env=dict(env, GRADPROBE_RESULT_FD=str(res_w)),
        start_new_session=True, pass_fds=(res_w, ctl, *(python.fds() if python else ())),
    )
    assert proc.stdin is not None
    proc.stdin.write(job.model_dump_json().encode())
    try:
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    proc.stdin.close()
    return proc.pid, asyncio.ensure_future(proc.wait())


_BACKGROUND: set[asyncio.Future[None]] = set()


def _close_later(pending: list[asyncio.Future[Any]], transports: list[Any], grace_s: float) -> None:
    """Close the call's pipes once its readers and exit are done (after the reply), or after the grace time."""
    async def finish() -> None:
        if pending:
            await asyncio.wait(pending, timeout=grace_s)
        for t in pending:
            t.cancel()
        for tr in transports:
            tr.close()

    task = asyncio.ensure_future(finish())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def settle(timeout_s: float = 10.0) -> None:
    """Wait for what calls left running after their replies (their pipes and the children's exits), at most
    timeout_s: a one-shot process (the command line) calls this before its event loop closes, so no child is still
    watched by a closed loop."""
    pending = list(_BACKGROUND)
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)


def _reap_later(cgroup: CallCgroup | None, scratch: str, orphan: int | None) -> None:
    """After the reply: wait until the call's cgroup is empty, remove it and the scratch dir, and reap the call's
    pid 1 if its keeper died first (it was reparented to this process, a subreaper)."""
    def work() -> None:
        if cgroup is not None:
            cgroup.kill()
        for _ in range(100 if orphan is not None else 0):
            try:
                if os.waitpid(orphan, os.WNOHANG)[0] != 0:  # type: ignore[arg-type]
                    break
            except ChildProcessError:
                break
            time.sleep(0.05)
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(scratch, ignore_errors=True)

    threading.Thread(target=work, daemon=True, name="gradprobe-reap").start()


def make_policy(job: Job, limits: Limits, *, scratch: str, python: Interpreter | None, timeout_s: float,
                allowed_roots: list[str] | None) -> Policy:
    """How the confining code builds this call's boundary."""
    device = job.target.get("device") or "cpu"
    return Policy(
        enabled=limits.isolate, require=limits.require_isolation,
        cgroup_spec=CgroupSpec(memory_bytes=limits.memory_bytes, pids=limits.pids, server=server_dir_name(),
                               parents=dict(placement().parents)) if limits.isolate else None,
        project_dir=job.target.get("project_dir"), allowed_roots=[os.path.realpath(r) for r in allowed_roots or []],
        package_root=PACKAGE_ROOT, scratch=scratch,
        # the interpreter, resolved once: the launcher executes exactly that open file, and only the installation
        # prefixes derived from it are bound (never the server's working directory or other sys.path entries)
        python=python.real if python else None, python_exec=python.exec_spec() if python else None,
        extra_ro=[],
        read_paths=[str(p) for p in job.target.get("read_paths") or []],  # bound per call, like the project
        idmap_data=not allowed_roots,  # with roots, what a root-owned private file in them says stays private
        scratch_bytes=limits.scratch_bytes, shm_bytes=limits.shm_bytes,
        devices=_gpu_devices() if device.startswith("cuda") or device == "auto" else [],
        limits=limits.for_child(timeout_s, device),
    )


@dataclass
class _Confinement:
    """What the confining code said over the control socket (before any user code), and what the server checked."""

    pid: int | None = None
    layers: dict[str, Layer] | None = None
    refused: str | None = None
    verified: Verified = field(default_factory=Verified)


@dataclass
class _Results:
    """What the child sent on the result pipe."""

    phase: Phase = Phase.STARTING
    events: list[str] = field(default_factory=list)
    report: dict[str, Any] | None = None
    tool_error: str | None = None
    tool_error_kind: Literal["caller", "interpreter"] = "caller"
    start_error: str | None = None
    bytes: int = 0

    @property
    def got(self) -> bool:
        return self.report is not None or self.tool_error is not None


class _ChildCall:
    """One run of `run_child`: the child's start, its pipes, the wait, the outcome, the teardown."""

    def __init__(self, job: Job, *, python: Interpreter | None, timeout_s: float, limits: Limits, progress: ProgressFn | None,
                 warm: WarmWorker | None, allowed_roots: list[str] | None):
        self.python, self.timeout_s, self.limits, self.progress, self.warm = python, timeout_s, limits, progress, warm
        self.scratch = tempfile.mkdtemp(prefix="gradprobe-call-", dir="/tmp")
        self.env = child_env(self.scratch)  # the target's own `env` is applied by the child, inside every layer (child.py)
        self.policy = make_policy(job, limits, scratch=self.scratch, python=python, timeout_s=timeout_s,
                                  allowed_roots=allowed_roots)
        if self.policy.project_dir:  # the child mounts the directory it opens at this path (and refuses one outside the roots)
            job = job.model_copy(update={"target": dict(job.target, project_dir=os.path.realpath(self.policy.project_dir))})
        self.job = job
        self.cgroup: CallCgroup | None = None  # made here for a cold child; a warm one's comes made (and joined) from the worker
        self.pipes = [os.pipe() for _ in range(3)]
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.t0 = time.monotonic()
        self.pid: int | None = None
        self.exited: asyncio.Future[int] | None = None
        self.transports: list[Any] = []
        self.readers: list[asyncio.Future[None]] = []
        self.mode: str = "cold"
        self.note: str | None = None
        self.after_reply = False
        self.confined = _Confinement()
        self.results = _Results()
        self.started = asyncio.Event()  # set by the first progress past "starting": the call's timeout runs from then
        self.out, self.err = CappedStream(), CappedStream()

    async def run(self) -> ChildOutcome:
        try:
            await self._start()
            await self._open_pipes()
            return await self._finish(*await self._wait())
        except asyncio.CancelledError:
            if self.pid is not None:
                _kill_group(self.pid)
            raise
        finally:
            self._teardown()

    # ---- start -----------------------------------------------------------------------------------------------

    async def _start(self) -> None:
        w_ends = tuple(w for _, w in self.pipes) + (self.theirs.fileno(),)
        if self.warm is not None and self.python is None:
            if await self.warm.ensure():
                await self._fork_warm(self.warm, w_ends)
            else:
                self.note = f"warm worker unavailable ({self.warm.error}); used a cold child"
        if self.mode == "cold":
            if self.limits.isolate:
                self.cgroup = CallCgroup(self.limits.memory_bytes, self.limits.pids)
                self.policy = self.policy.model_copy(update={
                    "cgroups": self.cgroup.procs_files if self.cgroup.ok else [], "cgroup_state": cgroup_layer(self.cgroup)})
            become_subreaper()
            self.pid, self.exited = await _launch_cold(self.job, self.python, self.scratch, self.env, w_ends, self.policy)

    async def _fork_warm(self, warm: WarmWorker, w_ends: tuple[int, ...]) -> None:
        try:
            self.pid, self.exited, made = await warm.fork(self.job, self.scratch, dict(self.env), w_ends, self.policy)
            self.cgroup = CallCgroup.adopt(made) if made else None
            self.mode = "warm"
        except Exception as exc:
            self.note = f"warm worker failed ({type(exc).__name__}: {exc}); used a cold child"

    async def _open_pipes(self) -> None:
        for _, w in self.pipes:
            os.close(w)
        self.theirs.close()
        self.pipes = [(r, -1) for r, _ in self.pipes]
        (out_r, _), (err_r, _), (res_r, _) = self.pipes
        out_reader, t1 = await _reader_for(out_r, 1 << 16)
        err_reader, t2 = await _reader_for(err_r, 1 << 16)
        reader, t3 = await _reader_for(res_r)
        ctl_reader, ctl_writer = await asyncio.open_unix_connection(sock=self.ours)
        self.transports = [t1, t2, t3, ctl_writer]
        self.pipes = []
        self.readers = [
            asyncio.ensure_future(self._read_results(reader)),
            asyncio.ensure_future(_drain(out_reader, self.out)),
            asyncio.ensure_future(_drain(err_reader, self.err)),
            asyncio.ensure_future(self._control(ctl_reader, ctl_writer)),
        ]

    # ---- the control socket: the confining code's messages, checked from outside, then "go" ----------------

    async def _control(self, ctl_reader: asyncio.StreamReader, ctl_writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                msg = Control.model_validate_json(await ctl_reader.readline())
            except (ValueError, ConnectionError, asyncio.LimitOverrunError):
                return
            if msg.pid is not None:
                self.confined.pid = msg.pid
            if msg.refused is not None:
                self.confined.refused = msg.refused[:2000]
                return
            if msg.layers is not None:
                if self._check_layers(msg.layers):
                    ctl_writer.write(b"g")
                    await ctl_writer.drain()
                return

    def _check_layers(self, layers: dict[str, Layer]) -> bool:
        """Verify the confined process from outside; False (and the call refused) when isolation is required and
        a layer is not verified."""
        confined = self.confined
        confined.layers = {str(k): Layer(enforced=v.enforced, text=v.text[:300]) for k, v in layers.items()}
        if confined.pid is None and self.pid is not None:  # a warm call: pid 1 of the call is the keeper's child
            try:
                confined.pid = int(open(f"/proc/{self.pid}/task/{self.pid}/children").read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        if self.limits.isolate and confined.pid is not None:
            cgroup_name = self.cgroup.name if self.cgroup is not None and self.cgroup.ok else None
            confined.verified = verify(confined.pid, confined.layers, cgroup_name)
        bad = confined.verified.bad()
        if self.limits.require_isolation and bad:
            confined.refused = f"isolation required but not verified: {', '.join(bad)} ({confined.verified.shown()})"
            return False
        return True

    # ---- the result pipe: untrusted (the user's code can reach it), so a line that is not a message is dropped --

    async def _read_results(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                return
            if not line:
                return
            self.results.bytes += len(line)
            if self.results.bytes > RESULT_CAP:
                return
            try:
                msg = CHILD_MESSAGE.validate_json(line)
            except ValueError:
                continue  # not ours: ignore, never trust
            await self._take(msg)

    async def _take(self, msg: Progress | Result | StartFailed) -> None:
        res = self.results
        if isinstance(msg, Progress):
            phase = clean(msg.phase.value)[:40]  # no terminal control characters reach a client
            if len(res.events) >= PROGRESS_CAP or (phase not in res.events and len(set(res.events)) >= PHASE_CAP):
                return  # one call sends at most PROGRESS_CAP events and PHASE_CAP distinct phases
            res.phase = msg.phase
            res.events.append(phase)
            if msg.phase is not Phase.STARTING:
                self.started.set()  # the child is on the user's code: the call's time runs from here
            if self.progress is not None:
                await self.progress(phase, time.monotonic() - self.t0)
        elif isinstance(msg, StartFailed):
            res.start_error = f"{msg.error}"[:2000]
        elif isinstance(msg.report, ToolError):
            res.tool_error, res.tool_error_kind = msg.report.tool_error[:2000], msg.report.tool_error_kind
        else:
            res.report = msg.report

    # ---- the end of the call ---------------------------------------------------------------------------------

    async def _wait(self) -> tuple[bool, bool]:
        """Until the child sent its result or exited, or its time is up (not until every inherited pipe closes:
        grandchildren the user's code left behind must not hold the call open; the child's exit and the teardown
        of its namespaces happen after the reply). Returns (timed_out, early: the result is in, the child lives)."""
        assert self.exited is not None and self.pid is not None
        exited = self.exited
        started: asyncio.Future[Any] = asyncio.ensure_future(self.started.wait())  # confining, checks, (cold) torch
        setup: list[asyncio.Future[Any]] = [started, exited, self.readers[0]]
        await asyncio.wait(setup, timeout=SETUP_S, return_when=asyncio.FIRST_COMPLETED)  # at most SETUP_S
        started.cancel()
        deadline = time.monotonic() + self.timeout_s
        first: list[asyncio.Future[Any]] = [exited, self.readers[0]]
        done, _ = await asyncio.wait(first, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if done and not exited.done() and not self.results.got:  # the result pipe closed without a result: wait for the exit
            done, _ = await asyncio.wait([exited], timeout=max(0.0, deadline - time.monotonic()))
        timed_out = not done
        early = bool(done) and not exited.done() and self.results.got
        _kill_group(self.pid)  # anything the child left behind in its group
        if self.cgroup is not None and self.cgroup.ok and not early:
            self.cgroup.kill_now()  # ... and anything that left the group (setsid daemons)
        self.after_reply = early  # with the result in, the cgroup's kill is the reaper's first act, just after the reply
        if early:
            for _ in range(3):  # the child flushed stdout/stderr before its result: let the drains take what is there
                await asyncio.sleep(0)
        else:
            await asyncio.wait(self.readers + [exited], timeout=self.limits.grace_s)
            for t in self.readers:
                t.cancel()
        return timed_out, early

    async def _finish(self, timed_out: bool, early: bool) -> ChildOutcome:
        exited, res = self.exited, self.results
        assert exited is not None
        code = exited.result() if exited.done() and not exited.cancelled() and exited.exception() is None else None
        report, tool_error = res.report, res.tool_error  # its isolation claims are dropped where it is turned into an
        if self.confined.refused:                         # answer (call.py: the account is the server's own)
            tool_error, report = self.confined.refused, None
        return ChildOutcome(
            report=report, tool_error=tool_error, tool_error_kind=res.tool_error_kind, phase=res.phase,
            returncode=code, timed_out=timed_out, stdout=self.out.text(), stderr=self.err.text(),
            seconds=time.monotonic() - self.t0, events=res.events, mode=self.mode, note=self.note,
            oom=bool(report is None and self.cgroup is not None and self.cgroup.oom_killed()),
            isolation={"applied": shown(self.confined.layers or {}), "verified_by_server": self.confined.verified.shown()},
            start_error=res.start_error,
        )

    def _teardown(self) -> None:
        if self.pid is not None:
            _kill_group(self.pid)
        if self.cgroup is not None and not self.after_reply:
            self.cgroup.kill_now()
        late: list[asyncio.Future[Any]] = [t for t in [*self.readers, self.exited] if t is not None and not t.done()]
        _close_later(late, self.transports, self.limits.grace_s)
        for r, w in self.pipes:
            for fd in (r, w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        if not self.transports:
            self.ours.close()
        self.theirs.close()
        _reap_later(self.cgroup, self.scratch, self.confined.pid if self.mode == "cold" else None)


async def run_child(
    job: Job,
    *,
    python: str | Interpreter | None = None,
    timeout_s: float = 120.0,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
    warm: WarmWorker | None = None,
    allowed_roots: list[str] | None = None,
) -> ChildOutcome:
    """Run one job in a fresh confined child (forked from the warm worker when one is given and
    usable, else launch.py + the named interpreter); never raises for anything the child does."""
    if isinstance(python, str):  # a path (a Ray worker, a library caller): resolved once, here
        try:
            interp = resolve(python, "named by the target's `python`", "target")
        except InterpreterError as exc:
            return ChildOutcome(None, str(exc), Phase.STARTING, None, False, "", "", 0.0, tool_error_kind="interpreter")
        try:
            return await run_child(job, python=interp, timeout_s=timeout_s, limits=limits, progress=progress, warm=warm,
                                   allowed_roots=allowed_roots)
        finally:
            interp.close()
    if python is not None and python.is_server:
        python = None
    call = _ChildCall(job, python=python, timeout_s=timeout_s, limits=limits or Limits(), progress=progress, warm=warm,
                      allowed_roots=allowed_roots)
    return await call.run()


def _gpu_devices() -> list[str]:
    try:
        return [n for n in os.listdir("/dev") if n.startswith("nvidia")]
    except OSError:
        return []
