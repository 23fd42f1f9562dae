"""Several ranks of a training script inside one sandbox call (the child's side).

Two ways a script runs as several processes, both kept inside the call's sandbox (its pid namespace, cgroup,
seccomp filter and Landlock rules are inherited by every rank, and the call's end kills them all):
- `world_size` > 1 on the target (torchrun-style): the child forks `world_size` rank processes, each running the
  script as `__main__` with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
  MASTER_PORT on the call's private loopback (gloo);
- a script that starts its own workers with `torch.multiprocessing.spawn` / `start_processes`: the call to it is
  replaced, for the length of the script's run, by one that starts the same workers with the same start method
  around a gradprobe entry (`_spawned_rank`, importable by path in the spawned interpreter), which installs the
  observers and then calls the user's function; the script itself is stopped after its workers were checked.

Every rank runs the ordinary script-mode job (scriptmode/first_step.py) with the rank watch (rankwatch.py) beside
it, writes its report (`result<i>.json`) and its first step's snapshot (`obs<i>.json`) to a rank folder in the
call's scratch, then waits to be ended (a rank that left would break its peers' collectives). The launcher waits
until every rank reported, or until the script's share of the timeout: then each rank still without a step dumps
its Python stack (faulthandler on SIGUSR1) and is a rank that hangs. The reports are merged (rankmerge.py).
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from gradprobe.sandbox.protocol import Phase, Result, ToolError, json_safe
from gradprobe.scriptmode.rankmerge import RankOutcome, merge_ranks
from gradprobe.scriptmode.rankwatch import write_json

# the share of the call's timeout after which a rank that reached no step is stuck (as run.py's SCRIPT_SHARE), and
# the share after which ranks still in their checks are ended
HANG_SHARE, END_SHARE = 0.7, 0.92
PROBE_S = 2.0  # once a rank reported: how often the others' stacks are probed for a collective no one will join
Progress = Callable[[str], None]


class RankChannel:
    """A rank's stand-in for the child's result channel: the report goes to a file, then the rank waits."""

    def __init__(self, out_dir: str, index: int, t0: float):
        self.path = os.path.join(out_dir, f"result{index}.json")
        self.t0 = t0  # the call's start (CLOCK_MONOTONIC is system-wide): run.py's budget counts from it

    def progress(self, phase: Phase | str) -> None:
        """Ranks do not report progress: the launcher does, once for all."""

    def finish(self, result: Result) -> NoReturn:
        report = result.report
        write_json(self.path, report.model_dump() if isinstance(report, ToolError) else report)
        linger()


def linger() -> NoReturn:
    """Wait to be ended by the launcher (peers may still be in a collective with this rank)."""
    while True:
        time.sleep(3600)


def rank_process(tool: str, target: dict[str, Any], options: dict[str, Any], out_dir: str, index: int, t0: float,
                 entry: Callable[[], Any] | None = None) -> NoReturn:
    """One rank: the rank watch, the ordinary script job (the script, or `entry` for a spawned worker), the report."""
    import faulthandler

    import torch

    from gradprobe.report import make_report
    from gradprobe.sandbox.failures import script_internal_error
    from gradprobe.scriptmode.rankwatch import RankWatch
    from gradprobe.userframes import UserCode

    stacks = open(os.path.join(out_dir, f"stack{index}.txt"), "w", encoding="utf-8")  # kept open: faulthandler writes to it
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=False)
    torch.set_num_threads(1)  # as torchrun does for several ranks on one machine
    chan = RankChannel(out_dir, index, t0)
    steps = tool == "audit_training" or (tool == "diagnose" and bool(options.get("steps")))  # the run goes on
    watch = RankWatch(UserCode(os.path.realpath(target["project_dir"])), out_dir, index, release=not steps)
    job_target = dict(target, world_size=1)
    if entry is not None:
        job_target["_entry"] = entry
    watch.install()
    try:
        from gradprobe.scriptmode.first_step import run_script_job

        report: ToolError | dict[str, Any] = run_script_job(tool, job_target, options, chan.progress)
    except BaseException as exc:  # ours (the script's own errors are findings)
        report = make_report(tool, [script_internal_error(f"{type(exc).__name__}: {exc}", {})])
    finally:
        watch.uninstall()
    from gradprobe.scriptmode.modelranks import ModelStep

    if isinstance(entry, ModelStep):  # a build_model() target: its load failure, what the rank did
        report = entry.finish(tool, report)
    chan.finish(Result(report=report if isinstance(report, ToolError) else json_safe(report)))


def rank_dir() -> str:
    scratch = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="ranks-", dir=scratch)


def _has(out_dir: str, kind: str, i: int) -> bool:
    return os.path.exists(os.path.join(out_dir, f"{kind}{i}.json"))


class _Waiter:
    """The launcher's wait (see `wait_ranks`)."""

    def __init__(self, out_dir: str, pids: list[int], exit_code: Callable[[int], int | None]):
        self.out_dir, self.pids, self.exit_code = out_dir, pids, exit_code
        self.out = RankOutcome(out_dir, len(pids))
        self.last_seen: dict[int, str] = {}  # rank -> the collective and line its last stack showed

    def pending(self) -> list[int]:
        for i in range(len(self.pids)):
            if i not in self.out.exits and not _has(self.out_dir, "result", i):
                code = self.exit_code(i)
                if code is not None:
                    self.out.exits[i] = code
        return [i for i in range(len(self.pids)) if i not in self.out.exits and not _has(self.out_dir, "result", i)]

    def waiting_in(self, pending: list[int]) -> dict[int, str]:
        """Dump the pending ranks' stacks: the collective (and line) each waits in, for those in one."""
        from gradprobe.scriptmode.rankwatch import collective_of, last_dump

        for i in pending:
            _signal(self.pids[i], signal.SIGUSR1)
        time.sleep(0.3)
        out: dict[int, str] = {}
        for i in pending:
            stack = last_dump(os.path.join(self.out_dir, f"stack{i}.txt"))
            collective, _ = collective_of(stack)
            if collective is not None:
                out[i] = f"{collective}|{stack[:2000]}"
        return out

    def stuck_early(self, pending: list[int]) -> bool:
        """Every other rank has reported (it calls no collective any more) and each pending rank showed the same
        collective wait at two probes in a row: they can never be joined."""
        seen = self.waiting_in(pending)
        same = len(seen) == len(pending) and all(self.last_seen.get(i) == seen[i] for i in pending)
        self.last_seen = seen
        return same


def wait_ranks(out_dir: str, pids: list[int], exit_code: Callable[[int], int | None], t0: float,
               timeout_s: float) -> RankOutcome:
    """Wait for every rank's report; the ranks stuck before a step (at the script's share of the timeout, or as soon
    as the others reported and they wait in a collective) dump their stacks; then end them all."""
    waiter = _Waiter(out_dir, pids, exit_code)
    out = waiter.out
    hang_at, end_at = t0 + timeout_s * HANG_SHARE + 2.0, t0 + timeout_s * END_SHARE
    started = time.monotonic()
    next_probe = 0.0
    while True:
        pending = waiter.pending()
        if not pending:
            break
        now = time.monotonic()
        reported = len(pending) < len(pids)
        if not out.stuck and reported and now >= next_probe and not any(_has(out_dir, "obs", i) for i in pending):
            next_probe = now + PROBE_S
            if waiter.stuck_early(pending):
                out.stuck = pending
                break
        if not out.stuck and now >= hang_at:
            out.stuck = [i for i in pending if not _has(out_dir, "obs", i)]
            for i in out.stuck:
                _signal(pids[i], signal.SIGUSR1)
            time.sleep(0.5)
            if len(out.stuck) == len(pending):
                break
            continue
        if now >= end_at:
            out.unfinished = [i for i in pending if i not in out.stuck]
            break
        time.sleep(0.05)
    out.seconds = time.monotonic() - started
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call_t0(progress: Progress) -> float:
    t0 = getattr(getattr(progress, "__self__", None), "t0", None)
    return t0 if isinstance(t0, float) else time.monotonic()


# ---- torchrun-style: the child forks the ranks ---------------------------------------------------------------------

def run_torchrun_style(tool: str, target: dict[str, Any], options: dict[str, Any],
                       progress: Progress) -> ToolError | dict[str, Any]:

    from gradprobe.scriptmode.modelranks import ModelStep

    n = int(target.get("world_size") or 1)
    model_form = not (target.get("script") or target.get("module"))  # a build_model() target: ModelStep is its script
    t0 = _call_t0(progress)
    out_dir = rank_dir()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(n),
           "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "ROLE_RANK": "0", "NODE_RANK": "0",
           "TORCHELASTIC_RUN_ID": "gradprobe", "OMP_NUM_THREADS": "1"}
    progress(Phase.RUNNING_SCRIPT)
    pids: list[int] = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.environ.update(env, RANK=str(i), LOCAL_RANK=str(i), ROLE_WORLD_SIZE=str(n))
                rank_process(tool, target, options, out_dir, i, t0, entry=ModelStep(target) if model_form else None)
            finally:
                os._exit(70)
        pids.append(pid)

    def exit_code(i: int) -> int | None:
        try:
            pid, status = os.waitpid(pids[i], os.WNOHANG)
        except ChildProcessError:
            return -1
        return os.waitstatus_to_exitcode(status) if pid else None

    outcome = wait_ranks(out_dir, pids, exit_code, t0, float(target.get("timeout_s") or 120.0))
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    progress(Phase.CHECKING)
    return merge_ranks(tool, target, outcome, how="build_model() form" if model_form else "torchrun-style")


# ---- scripts that spawn their own workers ----------------------------------------------------------------------------

def _spawned_rank(index: int, fn: Callable[..., Any], fn_args: tuple[Any, ...], cfg: dict[str, Any]) -> None:
    """The entry of a worker the script spawned (runs in the worker): observers, then the user's function."""
    rank_process(cfg["tool"], cfg["target"], cfg["options"], cfg["out_dir"], index, cfg["t0"],
                 entry=lambda: fn(index, *fn_args))


@dataclass
class SpawnFollow:
    """The script's call to `start_processes`, replaced while it runs (see the module docstring)."""

    tool: str
    target: dict[str, Any]
    options: dict[str, Any]
    t0: float
    outcome: RankOutcome | None = None
    location: dict[str, Any] | None = None
    _undo: list[tuple[Any, str, Any]] = field(default_factory=list)

    def install(self) -> None:
        import importlib

        import torch.multiprocessing as tmp

        tspawn = importlib.import_module("torch.multiprocessing.spawn")  # the module (the package's `spawn` is a function)

        orig = tspawn.start_processes
        follow = self

        def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                            daemon: bool = False, start_method: str = "spawn") -> Any:
            if follow.outcome is not None:  # a second spawn after the first was checked: stop the script
                raise _stop("the script's workers were checked")
            signal.setitimer(signal.ITIMER_REAL, 0, 0)  # the wait below keeps the call's deadline
            from gradprobe.userframes import UserCode

            follow.location = UserCode(os.path.realpath(follow.target["project_dir"])).innermost(skip=2)
            out_dir = rank_dir()
            cfg = {"tool": follow.tool, "target": follow.target, "options": follow.options, "out_dir": out_dir,
                   "t0": follow.t0}
            ctx = orig(_spawned_rank, args=(fn, tuple(args), cfg), nprocs=nprocs, join=False, daemon=daemon,
                       start_method=start_method)
            procs = ctx.processes
            follow.outcome = wait_ranks(out_dir, [int(p.pid) for p in procs], lambda i: procs[i].exitcode, follow.t0,
                                        float(follow.target.get("timeout_s") or 120.0))
            for p in procs:
                p.join(1.0)
            raise _stop("the script's workers were checked")

        for owner in (tspawn, tmp):
            if getattr(owner, "start_processes", None) is orig:
                self._undo.append((owner, "start_processes", orig))
                owner.start_processes = start_processes  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()


def _stop(why: str) -> BaseException:
    from gradprobe.scriptmode.observe import StopScript

    return StopScript(why)


def run_script_ranks(tool: str, target: dict[str, Any], options: dict[str, Any],
                     progress: Progress) -> ToolError | dict[str, Any]:
    """A script target: several ranks when `world_size` > 1; else the ordinary job, following any workers it spawns.
    A build_model() target comes here with `world_size` > 1 only (its ranks run scriptmode/modelranks.py)."""
    from gradprobe.scriptmode.first_step import run_script_job

    if int(target.get("world_size") or 1) > 1:
        return run_torchrun_style(tool, target, options, progress)
    follow = SpawnFollow(tool, target, options, _call_t0(progress))
    follow.install()
    try:
        report = run_script_job(tool, target, options, progress)
    finally:
        follow.uninstall()
    if follow.outcome is None:
        return report

    progress(Phase.CHECKING)
    return merge_ranks(tool, target, follow.outcome, how="mp.spawn", spawn_location=follow.location)
