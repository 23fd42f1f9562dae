"""Parent side of the process boundary: start a child per call, limit it, stream progress, kill it.

The server never imports torch or user code; it only starts
`gradprobe/sandbox/child.py` with a scrubbed environment, a scratch HOME/cwd,
rlimits, a wall-clock timeout and its own process group, and reads JSON lines
from a dedicated pipe. Whatever the child does (crash, hang, exit, flood its
output, forge lines), the call ends with a report or a clear error.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from collections.abc import Awaitable, Callable

from gradprobe.sandbox.cgroups import CallCgroup

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTPUT_CAP = 64 * 1024
RESULT_CAP = 8 * 1024 * 1024
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

ProgressFn = Callable[[str, float | None], Awaitable[None]]


class ToolInputError(ValueError):
    """A problem the caller fixes by changing the arguments (bad path, missing callable)."""


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

    def for_child(self, timeout_s: float, device: str) -> dict:
        gpu = device.startswith("cuda") or device == "auto"
        return {
            # CUDA reserves huge virtual ranges: RLIMIT_AS only on CPU runs
            "memory_bytes": None if gpu else self.memory_bytes,
            "cpu_seconds": self.cpu_seconds or int(timeout_s * 2 + 30),
            "file_bytes": self.file_bytes,
            "open_files": self.open_files,
        }


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


def child_env(scratch: str) -> dict:
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
    report: dict | None
    tool_error: str | None
    phase: str
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float
    events: list = field(default_factory=list)
    mode: str = "cold"
    note: str | None = None
    oom: bool = False
    # what the tool_error is about: the caller's arguments, or the interpreter the target named
    tool_error_kind: Literal["caller", "interpreter"] = "caller"


async def _reader_for(fd: int, limit: int = RESULT_CAP) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    return reader, transport


async def _launch_cold(job: dict, python: str | None, scratch: str, env: dict, fds: tuple[int, int, int]):
    out_w, err_w, res_w = fds
    proc = await asyncio.create_subprocess_exec(
        python or sys.executable, "-I", CHILD, stdin=asyncio.subprocess.PIPE, stdout=out_w, stderr=err_w,
        cwd=scratch, env=dict(env, GRADPROBE_RESULT_FD=str(res_w)), start_new_session=True, pass_fds=(res_w,),
    )
    assert proc.stdin is not None  # stdin=PIPE
    proc.stdin.write(json.dumps(job).encode())
    try:
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    proc.stdin.close()
    return proc.pid, asyncio.ensure_future(proc.wait())


async def run_child(
    job: dict,
    *,
    python: str | None = None,
    timeout_s: float = 120.0,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
    warm=None,
) -> ChildOutcome:
    """Run one job in a fresh child process (forked from the warm worker when one is given and
    usable, else a cold interpreter); never raises for anything the child does."""
    limits = limits or Limits()
    device = (job.get("target") or {}).get("device") or "cpu"
    job = dict(job, limits=limits.for_child(timeout_s, device))
    scratch = tempfile.mkdtemp(prefix="gradprobe-call-")
    env = child_env(scratch)
    cgroup = CallCgroup(limits.memory_bytes, limits.pids) if limits.isolate else None
    job["isolation"] = {
        "enabled": limits.isolate, "require": limits.require_isolation,
        "cgroups": cgroup.procs_files if cgroup is not None and cgroup.ok else [],
        "cgroup_state": cgroup.describe() if cgroup is not None else "off",
        "cgroup_enforced": cgroup is not None and cgroup.ok,
        "project_dir": (job.get("target") or {}).get("project_dir") or scratch,
        "package_root": PACKAGE_ROOT, "scratch": scratch,
    }
    pipes = [os.pipe() for _ in range(3)]
    t0 = time.monotonic()
    pid: int | None = None
    transports: list[asyncio.BaseTransport] = []
    mode, warm_note = "cold", None
    try:
        if warm is not None and python is None:
            if await warm.ensure():
                mode = "warm"
            else:
                warm_note = f"warm worker unavailable ({warm.error}); used a cold child"
        w_ends = (pipes[0][1], pipes[1][1], pipes[2][1])  # stdout, stderr, result
        if mode == "warm":
            try:
                pid, exited = await warm.fork(job, scratch, dict(env), w_ends)
            except Exception as exc:
                mode, warm_note = "cold", f"warm worker failed ({type(exc).__name__}: {exc}); used a cold child"
        if mode == "cold":
            pid, exited = await _launch_cold(job, python, scratch, env, w_ends)
        for w in w_ends:
            os.close(w)
        pipes = [(r, -1) for r, _ in pipes]
        (out_r, _), (err_r, _), (res_r, _) = pipes
        out_reader, t1 = await _reader_for(out_r, 1 << 16)
        err_reader, t2 = await _reader_for(err_r, 1 << 16)
        reader, t3 = await _reader_for(res_r)
        transports = [t1, t2, t3]
        pipes = []
        out, err = CappedStream(), CappedStream()
        state: dict[str, Any] = {"phase": "starting", "report": None, "tool_error": None, "tool_error_kind": "caller",
                                 "events": [], "bytes": 0}

        async def read_results() -> None:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    return
                if not line:
                    return
                state["bytes"] += len(line)
                if state["bytes"] > RESULT_CAP:
                    return
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # not ours: ignore, never trust
                if not isinstance(msg, dict):
                    continue
                if msg.get("type") == "progress" and isinstance(msg.get("phase"), str):
                    state["phase"] = msg["phase"][:40]
                    state["events"].append(state["phase"])
                    if progress is not None:
                        await progress(state["phase"], time.monotonic() - t0)
                elif msg.get("type") == "result" and isinstance(msg.get("report"), dict):
                    rep = msg["report"]
                    if "tool_error" in rep:
                        state["tool_error"] = str(rep["tool_error"])[:2000]
                        state["tool_error_kind"] = "interpreter" if rep.get("tool_error_kind") == "interpreter" else "caller"
                    else:
                        state["report"] = rep

        timed_out = False
        readers = [
            asyncio.ensure_future(read_results()),
            asyncio.ensure_future(_drain(out_reader, out)),
            asyncio.ensure_future(_drain(err_reader, err)),
        ]
        try:
            # the call ends when the child exits (or its time is up), not when every inherited pipe closes:
            # grandchildren the user's code left behind must not hold the call open
            await asyncio.wait_for(asyncio.shield(exited), timeout=timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        assert pid is not None  # the child started
        _kill_group(pid)  # anything the child left behind in its group
        if cgroup is not None and cgroup.ok:
            cgroup.kill()  # ... and anything that left the group (setsid daemons)
        await asyncio.wait(readers + [exited], timeout=limits.grace_s)
        for t in readers:
            t.cancel()
        code = exited.result() if exited.done() and not exited.cancelled() and exited.exception() is None else None
        return ChildOutcome(
            report=state["report"], tool_error=state["tool_error"], tool_error_kind=state["tool_error_kind"], phase=state["phase"],
            returncode=code, timed_out=timed_out, stdout=out.text(), stderr=err.text(),
            seconds=time.monotonic() - t0, events=state["events"], mode=mode, note=warm_note,
            oom=bool(cgroup is not None and cgroup.oom_killed()),
        )
    except asyncio.CancelledError:
        if pid is not None:
            _kill_group(pid)
        raise
    finally:
        if pid is not None:
            _kill_group(pid)
        if cgroup is not None:
            cgroup.kill()
            cgroup.remove()
        for tr in transports:
            tr.close()
        for r, w in pipes:
            for fd in (r, w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        shutil.rmtree(scratch, ignore_errors=True)


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "did not exit"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"
