"""Launchers as users run them, for the paired runs (scriptmode/paired.py): a project's own launcher script that starts
torchrun on the real training script, and a script that starts its workers with torch.multiprocessing.spawn.

- A launcher: its call that starts torchrun (`torchrun`, `python -m torch.distributed.run` or `.launch`, `accelerate
  launch`), through subprocess.Popen (and so subprocess.run, call, check_call, check_output) or os.system, is read
  with the launcher's own argument parser (torch.distributed.run's, accelerate's): the training script or module, its
  arguments, the processes per node, the environment the launcher adds. The launcher is stopped there (`Launched`),
  and the comparisons run on what it starts: that script at that world size, torchrun-style, in that environment.
- mp.spawn: in the setup under test the workers are forked from the script's process, each with its own watch (its
  rank's records, `rank<i>` files), while the script's process waits for them and writes `spawned.json`; in the
  reference (one process) the call runs the user's function once, as rank 0, in the script's own process. There the
  call must ask for one process: a script that passes its world size to its workers itself is run for the reference
  with its own arguments for one process (`reference.args`); otherwise the reference says so (`spawned`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
ACCELERATE_MODULES = ("accelerate.commands.launch", "accelerate.commands.accelerate_cli")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class Launched(BaseException):
    """Raised into a launcher at its call that starts torchrun (not an Exception: `except Exception` lets it pass)."""

    def __init__(self, info: dict[str, Any]):
        super().__init__("the launcher starts torchrun")
        self.info = info


class SpawnedWorkers(BaseException):
    """Raised into a reference whose mp.spawn asks for several processes."""


def _argv(cmd: Any) -> tuple[list[str], dict[str, str]]:
    argv = shlex.split(cmd) if isinstance(cmd, str) else [os.fspath(a) for a in cmd]
    env: dict[str, str] = {}
    while argv and (m := _ASSIGN.match(argv[0])):  # VAR=value torchrun ... (a shell command)
        env[m.group(1)] = m.group(2)
        argv.pop(0)
    if argv and os.path.basename(argv[0]) == "env":
        argv.pop(0)
        while argv and (m := _ASSIGN.match(argv[0])):
            env[m.group(1)] = m.group(2)
            argv.pop(0)
    return argv, env


def _split(argv: list[str]) -> tuple[str, list[str]] | None:
    """("torchrun" | "accelerate", the launcher's own arguments) when argv starts a launcher gradprobe reads."""
    if not argv:
        return None
    exe = os.path.basename(argv[0])
    if exe == "torchrun":
        return "torchrun", argv[1:]
    if exe == "accelerate" and argv[1:2] == ["launch"]:
        return "accelerate", argv[2:]
    if exe.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        if argv[2] in TORCHRUN_MODULES:
            return "torchrun", argv[3:]
        if argv[2] in ACCELERATE_MODULES:
            return "accelerate", argv[4:] if argv[3:4] == ["launch"] else argv[3:]
    return None


def parse_launch(cmd: Any, cwd: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """What a command that starts torchrun starts: script (or module), args, nproc, env; {"error"} when it cannot be
    read; None when it starts no launcher."""
    try:
        argv, assigned = _argv(cmd)
    except ValueError:
        return None
    found = _split(argv)
    if found is None:
        return None
    kind, rest = found
    command = " ".join(shlex.quote(a) for a in argv)[:400]
    try:
        if kind == "torchrun":
            from torch.distributed.run import get_args_parser

            ns = get_args_parser().parse_args(rest)
            nproc, nnodes = str(ns.nproc_per_node), str(ns.nnodes)
            script, args, module = ns.training_script, list(ns.training_script_args), bool(ns.module)
            if ns.no_python:
                return {"error": f"`{command}` runs a program without Python (--no-python)", "command": command}
        else:
            from accelerate.commands.launch import launch_command_parser

            ns = launch_command_parser().parse_args(rest)
            nproc, nnodes = str(ns.num_processes or 1), str(ns.num_machines or 1)
            script, args, module = ns.training_script, list(ns.training_script_args), bool(ns.module)
    except SystemExit:
        return {"error": f"the launcher's arguments could not be read: `{command}`", "command": command}
    if nnodes not in ("1", "1:1") or not nproc.isdigit():
        return {"error": f"`{command}` asks for {nnodes} nodes of {nproc} processes: gradprobe runs one node of a known "
                         "number of processes", "command": command}
    extra = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
    extra.update(assigned)
    return {"kind": kind, "command": command, "script": script, "module": module, "args": [str(a) for a in args],
            "nproc": int(nproc), "cwd": cwd or os.getcwd(), "env": extra}


def retarget(target: dict[str, Any], launched: dict[str, Any]) -> dict[str, Any] | str:
    """The target the launcher starts (a script inside the project, or a module), or why it cannot be followed."""
    project = os.path.realpath(target["project_dir"])
    out = {k: v for k, v in target.items() if k not in ("script", "module")}
    out.update(args=launched["args"], world_size=launched["nproc"], launch_env=launched.get("env") or {})
    if launched.get("module"):
        return dict(out, module=launched["script"])
    path = os.path.realpath(os.path.join(launched.get("cwd") or project, launched["script"]))
    if os.path.commonpath([project, path]) != project or not os.path.isfile(path):
        return f"the launcher starts {launched['script']}, which is not a file of the project ({project})"
    return dict(out, script=os.path.relpath(path, project))


class LaunchFollow:
    """The launcher's and mp.spawn's calls, replaced for the rest of a paired run's process (see the module docstring):
    the run owns its forked process, so nothing is put back."""

    def __init__(self, watch: Any, fork_worker: Callable[[int, Callable[[], Any]], int]):
        self.w = watch
        self.fork_worker = fork_worker  # A: runs the worker's body in a forked process with its own watch

    def install(self) -> None:
        self._patch_popen()
        self._patch_spawn()

    def _patch_popen(self) -> None:
        follow = self
        orig_init, orig_system = subprocess.Popen.__init__, os.system

        def popen_init(proc: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
            follow._check(args, kwargs.get("cwd"), kwargs.get("env"))
            orig_init(proc, args, *rest, **kwargs)

        def system(command: str) -> int:
            follow._check(command, None, None)
            return int(orig_system(command))

        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign,assignment]
        os.system = system  # type: ignore[assignment]

    def _check(self, cmd: Any, cwd: Any, env: Any) -> None:
        if not self.w._main():
            return
        info = parse_launch(cmd, os.fspath(cwd) if cwd is not None else None, dict(env) if env is not None else None)
        if info is not None:
            info["by"] = self.w.user.innermost(skip=3)
            raise Launched(info)

    def _patch_spawn(self) -> None:
        import importlib

        import torch.multiprocessing as tmp

        module = importlib.import_module("torch.multiprocessing.spawn")
        orig = module.start_processes
        follow = self

        def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
                            daemon: bool = False, start_method: str = "spawn") -> Any:
            return follow._spawn(fn, tuple(args), int(nprocs))

        for owner in (module, tmp):
            if getattr(owner, "start_processes", None) is orig:
                owner.start_processes = start_processes  # type: ignore[attr-defined]

    def _spawn(self, fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> Any:
        w = self.w
        where = w.user.innermost(skip=4) or {"file": "", "line": 0, "function": "", "code": ""}
        w.spawned = dict(where, nprocs=nprocs)
        if w.role == "B":
            if nprocs != 1:
                raise SpawnedWorkers(f"the reference's mp.spawn asks for {nprocs} processes")
            fn(0, *args)  # rank 0 in this process: the watch ends it at its last step
            return None
        from gradprobe.scriptmode.ranks import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        pids = [self.fork_worker(i, functools.partial(fn, i, *args)) for i in range(nprocs)]
        signal.setitimer(signal.ITIMER_REAL, 0)  # the workers keep the deadline; this process only waits for them
        w.finished = True  # and never writes a rank's files
        exits = {}
        for i, pid in enumerate(pids):
            _, status = os.waitpid(pid, 0)
            exits[i] = os.waitstatus_to_exitcode(status)
        with open(os.path.join(w.out_dir, "spawned.json"), "w", encoding="utf-8") as fh:
            json.dump({"nprocs": nprocs, "location": where, "exits": exits}, fh)
        os._exit(0)  # the script's own process ends here: its workers ran the steps


def read_spawned(out_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(out_dir, "spawned.json"), encoding="utf-8") as fh:
            data: dict[str, Any] = json.load(fh)
            return data
    except (OSError, ValueError):
        return None


def run_watched(watch: Any, user: Any, deadline: float, body: Callable[[], Any]) -> None:
    """Run `body` (the script, or a spawned worker's function) under `watch` until the deadline; write its files and
    end the process (os._exit: nothing unwinds through the user's code)."""

    def on_alarm(signum: int, frame: Any) -> None:
        watch.finish("timeout", location=user.innermost(frame))
        os._exit(0)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic() - 1.0, 1.0))
    ended, error, loc = "finished", None, None
    try:
        body()
    except Launched as exc:
        ended = "launched"
        watch.extra["launched"] = exc.info
    except SpawnedWorkers:
        ended = "spawned"
    except SystemExit as exc:
        ended, error = "exited", f"sys.exit({exc.code!r})"
        loc = user.innermost_of_traceback(exc)
    except BaseException as exc:  # the script's own error
        ended, error = "raised", user.trimmed_traceback(exc)[-3000:]
        loc = user.innermost_of_traceback(exc)
    signal.setitimer(signal.ITIMER_REAL, 0)
    watch.finish(ended, error, loc)
    sys.stdout.flush()
    os._exit(0)
