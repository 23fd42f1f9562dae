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
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from gradprobe.render import clean
from gradprobe.sandbox.cgroups import CallCgroup, server_dir_name
from gradprobe.sandbox.isolation import become_subreaper

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTPUT_CAP = 64 * 1024
RESULT_CAP = 8 * 1024 * 1024
SETUP_S = 60.0  # before a call's timeout starts: confinement, the server's checks, a cold child importing torch
PROGRESS_CAP, PHASE_CAP = 64, 16  # progress events, and distinct phases, one call may send
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
    scratch_bytes: int = 1024**3  # private tmpfs /tmp (holds the call's scratch dir)
    shm_bytes: int = 512 * 1024**2  # private tmpfs /dev/shm

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
    isolation: dict = field(default_factory=dict)
    # what the tool_error is about: the caller's arguments, or the interpreter the target named
    tool_error_kind: Literal["caller", "interpreter"] = "caller"


async def _reader_for(fd: int, limit: int = RESULT_CAP) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    return reader, transport


async def _launch_cold(job: dict, python: str | None, scratch: str, env: dict, fds: tuple[int, ...], policy: dict):
    out_w, err_w, res_w, ctl = fds
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", LAUNCH, str(ctl), json.dumps(policy), python or sys.executable, CHILD,
        stdin=asyncio.subprocess.PIPE, stdout=out_w, stderr=err_w,
        cwd=scratch, env=dict(env, GRADPROBE_RESULT_FD=str(res_w)), start_new_session=True, pass_fds=(res_w, ctl),
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(job).encode())
    try:
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    proc.stdin.close()
    return proc.pid, asyncio.ensure_future(proc.wait())


def _ns(pid: int | str, name: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{name}")
    except OSError:
        return None


def verify(pid: int, claimed: dict, cgroup_name: str | None) -> dict:
    """What the server sees of the confined process from outside, before any user code runs in it."""
    seen: dict[str, str] = {}
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
        cg = open(f"/proc/{pid}/cgroup").read()
    except OSError as exc:
        return {"error": f"could not inspect the child ({exc.strerror})"}
    status: dict[str, list[str]] = {k: v.split() for k, _, v in (line.partition(":") for line in lines)}
    uid = status.get("Uid", ["?"])[0]
    capeff = int(status.get("CapEff", ["1"])[0], 16)
    seen["identity"] = (f"uid {uid}, effective capabilities {'none' if capeff == 0 else hex(capeff)}, "
                        f"no_new_privs {status.get('NoNewPrivs', ['?'])[0]}")
    seen["syscalls"] = "seccomp filter active" if status.get("Seccomp", ["0"])[0] == "2" else "MISSING: no seccomp filter"
    if claimed.get("filesystem", "").startswith("Landlock") and hasattr(os, "pidfd_open"):
        seen["filesystem"] = "Landlock (as claimed; not visible from outside)"
    apart = [n for n in ("mnt", "pid", "net", "ipc", "uts") if _ns(pid, n) is not None and _ns(pid, n) != _ns("self", n)]
    seen["namespaces"] = f"own {', '.join(apart)}" if apart else "MISSING: shares the server's namespaces"
    seen["cgroup"] = (f"in the call's cgroup {cgroup_name}" if cgroup_name and cgroup_name in cg
                      else "MISSING: not in the call's cgroup")
    if uid == "0" and "identity" in claimed:
        seen["identity"] = "MISSING: " + seen["identity"]
    return seen


_BACKGROUND: set[asyncio.Task] = set()


def _close_later(pending: list, transports: list, grace_s: float) -> None:
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


async def run_child(
    job: dict,
    *,
    python: str | None = None,
    timeout_s: float = 120.0,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
    warm=None,
    allowed_roots: list[str] | None = None,
) -> ChildOutcome:
    """Run one job in a fresh confined child (forked from the warm worker when one is given and
    usable, else launch.py + the named interpreter); never raises for anything the child does."""
    limits = limits or Limits()
    device = (job.get("target") or {}).get("device") or "cpu"
    scratch = tempfile.mkdtemp(prefix="gradprobe-call-", dir="/tmp")
    env = child_env(scratch)
    cgroup: CallCgroup | None = None  # made here for a cold child; a warm one's comes made (and joined) from the worker
    project = (job.get("target") or {}).get("project_dir")
    policy = {
        "enabled": limits.isolate, "require": limits.require_isolation,
        "cgroups": [], "cgroup_state": "off",
        "cgroup_spec": {"memory_bytes": limits.memory_bytes, "pids": limits.pids, "server": server_dir_name()} if limits.isolate else None,
        "project_dir": project, "allowed_roots": [os.path.realpath(r) for r in allowed_roots or []],
        "package_root": PACKAGE_ROOT, "scratch": scratch, "python": python,
        "extra_ro": [p for p in sys.path if p and os.path.isdir(p)],
        "scratch_bytes": limits.scratch_bytes, "shm_bytes": limits.shm_bytes,
        "devices": _gpu_devices() if device.startswith("cuda") or device == "auto" else [],
        "limits": limits.for_child(timeout_s, device),
    }
    if project:  # the child mounts the directory it opens at this path (and refuses one outside the roots)
        job = dict(job, target=dict(job["target"], project_dir=os.path.realpath(project)))
    pipes = [os.pipe() for _ in range(3)]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    t0 = time.monotonic()
    pid = None
    transports: list[Any] = []
    mode, warm_note = "cold", None
    after_reply = False
    confined: dict[str, Any] = {"pid": None, "layers": None, "refused": None, "verified": {}}
    try:
        if warm is not None and python is None:
            if await warm.ensure():
                mode = "warm"
            else:
                warm_note = f"warm worker unavailable ({warm.error}); used a cold child"
        w_ends = tuple(w for _, w in pipes) + (theirs.fileno(),)
        if mode == "warm":
            try:
                pid, exited, made = await warm.fork(job, scratch, dict(env), w_ends, policy)
                cgroup = CallCgroup.adopt(made) if made else None
            except Exception as exc:
                mode, warm_note = "cold", f"warm worker failed ({type(exc).__name__}: {exc}); used a cold child"
        if mode == "cold":
            if limits.isolate:
                cgroup = CallCgroup(limits.memory_bytes, limits.pids)
                policy.update(cgroups=cgroup.procs_files if cgroup.ok else [], cgroup_state=cgroup.describe())
            become_subreaper()
            pid, exited = await _launch_cold(job, python, scratch, env, w_ends, policy)
        cgroup_name = cgroup.name if cgroup is not None and cgroup.ok else None
        for w in w_ends[:3]:
            os.close(w)
        theirs.close()
        pipes = [(r, -1) for r, _ in pipes]
        (out_r, _), (err_r, _), (res_r, _) = pipes
        out_reader, t1 = await _reader_for(out_r, 1 << 16)
        err_reader, t2 = await _reader_for(err_r, 1 << 16)
        reader, t3 = await _reader_for(res_r)
        ctl_reader, ctl_writer = await asyncio.open_unix_connection(sock=ours)
        transports = [t1, t2, t3, ctl_writer]
        pipes = []
        out, err = CappedStream(), CappedStream()
        state: dict[str, Any] = {"phase": "starting", "report": None, "tool_error": None, "tool_error_kind": "caller",
                                 "events": [], "bytes": 0, "started": asyncio.Event()}

        async def control() -> None:
            """The confining code's messages (before any user code runs), checked from outside, then "go"."""
            while True:
                try:
                    line = await ctl_reader.readline()
                    msg = json.loads(line) if line else None
                except (ValueError, ConnectionError, asyncio.LimitOverrunError):
                    msg = None
                if not isinstance(msg, dict):
                    return
                if isinstance(msg.get("pid"), int):
                    confined["pid"] = msg["pid"]
                if isinstance(msg.get("refused"), str):
                    confined["refused"] = msg["refused"][:2000]
                    return
                if isinstance(msg.get("layers"), dict):
                    confined["layers"] = {str(k): str(v)[:300] for k, v in msg["layers"].items()}
                    if confined["pid"] is None and pid is not None:  # a warm call: pid 1 of the call is the keeper's child
                        try:
                            confined["pid"] = int(open(f"/proc/{pid}/task/{pid}/children").read().split()[0])
                        except (OSError, ValueError, IndexError):
                            pass
                    if limits.isolate and confined["pid"] is not None:
                        confined["verified"] = verify(confined["pid"], confined["layers"], cgroup_name)
                    bad = [k for k, v in confined["verified"].items() if v.startswith("MISSING") or k == "error"]
                    if limits.require_isolation and bad:
                        confined["refused"] = f"isolation required but not verified: {', '.join(bad)} ({confined['verified']})"
                        return
                    ctl_writer.write(b"g")
                    await ctl_writer.drain()
                    return

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
                    phase = clean(msg["phase"])[:40]  # no terminal control characters reach a client
                    events = state["events"]
                    if len(events) >= PROGRESS_CAP or (phase not in events and len(set(events)) >= PHASE_CAP):
                        continue
                    state["phase"] = phase
                    state["events"].append(state["phase"])
                    if phase != "starting":
                        state["started"].set()  # the child is on the user's code: the call's time runs from here
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
            asyncio.ensure_future(control()),
        ]
        # the call ends when the child has sent its result or exited (or its time is up), not when every inherited
        # pipe closes: grandchildren the user's code left behind must not hold the call open; the child's exit and
        # the teardown of its namespaces happen after the reply
        started = asyncio.ensure_future(state["started"].wait())  # confining, checks and (cold) torch: SETUP_S
        await asyncio.wait([started, exited, readers[0]], timeout=SETUP_S, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        deadline = time.monotonic() + timeout_s
        done, _ = await asyncio.wait([exited, readers[0]], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        got = state["report"] is not None or state["tool_error"] is not None
        if done and not exited.done() and not got:  # the result pipe closed without a result: wait for the exit
            done, _ = await asyncio.wait([exited], timeout=max(0.0, deadline - time.monotonic()))
        timed_out = not done
        early = bool(done) and not exited.done() and got
        assert pid is not None
        _kill_group(pid)  # anything the child left behind in its group
        if cgroup is not None and cgroup.ok and not early:
            cgroup.kill_now()  # ... and anything that left the group (setsid daemons)
        after_reply = early  # with the result in, the cgroup's kill is the reaper's first act, just after the reply
        if early:
            for _ in range(3):  # the child flushed stdout/stderr before its result: let the drains take what is there
                await asyncio.sleep(0)
        else:
            await asyncio.wait(readers + [exited], timeout=limits.grace_s)
            for t in readers:
                t.cancel()
        code = exited.result() if exited.done() and not exited.cancelled() and exited.exception() is None else None
        report = state["report"]
        if report is not None:  # the isolation facts are the server's: whatever the child wrote there is dropped
            report.setdefault("facts", {}).pop("isolation", None)
        tool_error = state["tool_error"]
        if confined["refused"]:
            tool_error, report = confined["refused"], None
        return ChildOutcome(
            report=report, tool_error=tool_error, tool_error_kind=state["tool_error_kind"], phase=state["phase"],
            returncode=code, timed_out=timed_out, stdout=out.text(), stderr=err.text(),
            seconds=time.monotonic() - t0, events=state["events"], mode=mode, note=warm_note,
            oom=bool(report is None and cgroup is not None and cgroup.oom_killed()),
            isolation={"applied": confined["layers"] or {}, "verified_by_server": confined["verified"]},
        )
    except asyncio.CancelledError:
        if pid is not None:
            _kill_group(pid)
        raise
    finally:
        if pid is not None:
            _kill_group(pid)
        if cgroup is not None and not after_reply:
            cgroup.kill_now()
        late = [t for t in locals().get("readers", []) + [locals().get("exited")] if t is not None and not t.done()]
        _close_later(late, transports, limits.grace_s)
        for r, w in pipes:
            for fd in (r, w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        if not transports:
            ours.close()
        theirs.close()
        _reap_later(cgroup, scratch, confined["pid"] if mode == "cold" else None)


def _gpu_devices() -> list[str]:
    try:
        return [n for n in os.listdir("/dev") if n.startswith("nvidia")]
    except OSError:
        return []


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "did not exit"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"
