"""check_equivalence on a script target (the child's side): the setup under test and its reference, each run in
processes forked from the child, then compared (gradprobe/checks/equivalence).

1. Setup A, the script as the user runs it (`world_size` ranks torchrun-style, gloo on the call's loopback), watched
   for `steps` optimizer steps by scriptmode/pairwatch.py: every batch its training DataLoader yields, rank 0's weights
   at the start of each step, the gradient each rank's optimizer sees, what each backward's loss was made of.
2. The reference, once per comparison that applies, fed what A consumed (pairwatch's Feed):
   - "ranks" (A at N > 1 processes): one process (WORLD_SIZE=1, the reference's own overrides), whose i-th batch is
     the N ranks' i-th batches joined in rank order;
   - "accumulation" (A's optimizer steps fed by k > 1 backward() calls): the same world size with accumulation 1, set
     through the framework's own setting (knobs.py) or, for a plain loop, by the caller's `reference.args`; its i-th
     batch is A's batches i*r .. (i+1)*r-1 joined (r: the batches A consumes per optimizer step, measured).
   Each reference process loads A's weights at the start of each step, so a difference at step 2 is step 2's own.
3. The engine (checks/equivalence/engine.py) gets where the runs wrote (`options["_paired"]`) and compares.
Every process ends itself with os._exit after its steps; one that does not finish in its share of the time is killed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from gradprobe.checks.equivalence.engine import PAIRED
from gradprobe.sandbox.protocol import Phase, ToolError
from gradprobe.scriptmode.feeds import SetupRun
from gradprobe.scriptmode.rankmerge import load_rank_file

A_SHARE, B_SHARE = 0.4, 0.25  # of the call's timeout: the setup under test, each reference
Progress = Callable[[str], None]


def _exec_target(target: dict[str, Any]) -> None:
    """The script (or `python -m` module) as run.py runs it: argv, sys.path, a working directory mirroring the project."""
    from gradprobe.scriptmode.run import _mirror_cwd, exec_script, scratch_dir

    project_dir = os.path.realpath(target["project_dir"])
    os.chdir(_mirror_cwd(project_dir, scratch_dir()))
    script, module = target.get("script"), str(target.get("module") or "")
    if not script and not module:  # a build_model() target at N ranks: each rank runs it as scriptmode/modelranks.py does
        from gradprobe.scriptmode.modelranks import ModelStep

        ModelStep(target)()
        return
    exec_script(project_dir, script, module, [str(a) for a in (target.get("args") or [])])


def _setup_process(target: dict[str, Any], role: str, index: int, env: dict[str, str], out_dir: str, steps: int,
                   deadline: float, feed_path: str | None, accumulation_to_one: bool) -> None:
    """One process of a setup (in the forked child): the watch, the script, the files; never returns."""
    import torch

    from gradprobe.loading import seed_everything
    from gradprobe.scriptmode.knobs import accumulation_hooks
    from gradprobe.scriptmode.launchers import LaunchFollow, run_watched
    from gradprobe.scriptmode.pairwatch import PairWatch
    from gradprobe.userframes import UserCode

    os.environ.update(target.get("launch_env") or {})  # what a launcher the script was started by adds (launchers.py)
    os.environ.update(env)
    if int(env.get("WORLD_SIZE", "1")) > 1:
        torch.set_num_threads(1)  # as torchrun does for several ranks on one machine
    user = UserCode(os.path.realpath(target["project_dir"]))
    seed_everything(int(target.get("seed") or 0))
    feed = torch.load(feed_path, weights_only=False) if feed_path else None
    watch = PairWatch(role, out_dir, index, steps, user, feed)
    hooks = accumulation_hooks(watch.knobs, to_one=accumulation_to_one,
                               one_process=role == "B" and env.get("WORLD_SIZE") == "1")

    def fork_worker(rank: int, body: Callable[[], Any]) -> int:
        """A worker the script spawns (mp.spawn, in setup A): forked, with its own watch for its rank's files."""
        pid = os.fork()
        if pid == 0:
            try:
                torch.set_num_threads(1)
                watch.finished = True  # the spawning process's watch never writes
                watch.uninstall()
                worker = PairWatch(role, out_dir, rank, steps, user, None)
                worker.spawned = watch.spawned  # where the script spawned it
                worker.install()
                LaunchFollow(worker, fork_worker).install()
                run_watched(worker, user, deadline, body)
            finally:
                os._exit(70)
        return pid

    hooks.install()
    watch.install()
    LaunchFollow(watch, fork_worker).install()
    run_watched(watch, user, deadline, lambda: _exec_target(target))


def run_setup(target: dict[str, Any], role: str, processes: int, steps: int, out_dir: str, seconds: float,
              distributed: bool, feeds: list[str | None] | None = None, accumulation_to_one: bool = False) -> SetupRun:
    """Fork the setup's processes (torchrun-style environment when `distributed`), wait for them, or kill them."""
    from gradprobe.scriptmode.ranks import free_port

    os.makedirs(out_dir, exist_ok=True)
    run = SetupRun(role, out_dir, processes)
    t0 = time.monotonic()
    deadline = t0 + seconds
    env: dict[str, str] = {}
    if distributed:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(processes),
               "LOCAL_WORLD_SIZE": str(processes), "GROUP_RANK": "0", "ROLE_RANK": "0", "NODE_RANK": "0",
               "TORCHELASTIC_RUN_ID": "gradprobe", "OMP_NUM_THREADS": "1"}
    pids: list[int] = []
    for i in range(processes):
        pid = os.fork()
        if pid == 0:
            try:
                rank_env = dict(env, RANK=str(i), LOCAL_RANK=str(i), ROLE_WORLD_SIZE=str(processes)) if distributed else {}
                _setup_process(target, role, i, rank_env, out_dir, steps, deadline,
                               (feeds or [None] * processes)[i], accumulation_to_one)
            finally:
                os._exit(70)
        pids.append(pid)
    _wait(run, pids, deadline)
    run.seconds = time.monotonic() - t0
    from gradprobe.scriptmode.launchers import read_spawned

    spawned = read_spawned(out_dir) if processes == 1 else None
    if spawned is not None:  # the script spawned its workers (launchers.py): they are the setup's processes
        run.processes = int(spawned["nprocs"])
        run.exits = {int(k): v for k, v in (spawned.get("exits") or {}).items()}
    run.infos = [load_rank_file(out_dir, "rank", i) for i in range(run.processes)]
    return run


def _wait(run: SetupRun, pids: list[int], deadline: float) -> None:
    """Until every process exited; a rank whose peer ended with an error waits in a collective: 5 s later, kill it."""
    alive = dict(enumerate(pids))
    grace: float | None = None
    while alive:
        for i, pid in list(alive.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                run.exits[i] = os.waitstatus_to_exitcode(status)
                del alive[i]
                info = load_rank_file(run.out_dir, "rank", i)
                if grace is None and (info is None or info.get("ended") != "stepped"):
                    grace = time.monotonic() + 5.0
        now = time.monotonic()
        if alive and (now >= deadline or (grace is not None and now >= grace)):
            for i, pid in alive.items():
                _kill(pid)
                run.killed.append(i)
            for pid in alive.values():
                os.waitpid(pid, 0)
            break
        time.sleep(0.05)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- the plan ------------------------------------------------------------------------------------------------------

def selected(options: dict[str, Any]) -> list[str] | None:
    names = options.get("compare")
    return [str(n) for n in names] if isinstance(names, list) and names else None


def _not_run(check: str, why: str, cause: str) -> dict[str, Any]:
    return {"not_run": {"check": check, "why": why, "cause": cause}}


def _failed_a(run: SetupRun, steps: int) -> str | None:
    """Why setup A cannot be compared (None: every process stepped `steps` times)."""
    for i, info in enumerate(run.infos):
        if info is None:
            return f"process {i} of the script ended without gradprobe's record (exit {run.exits.get(i)})" + (
                ", killed at the deadline" if i in run.killed else "")
        if info.get("ended") == "spawned":
            loc = info.get("spawned") or {}
            return (f"the script starts {loc.get('nprocs')} worker processes with torch.multiprocessing.spawn at line "
                    f"{loc.get('line')} of {os.path.basename(str(loc.get('file')))}, where the reference is one process: "
                    "a script that passes its world size to its workers itself is compared with its own arguments for "
                    "one process, `reference: {\"args\": [...]}` (e.g. [\"--world_size\", \"1\"])")
        if info.get("ended") != "stepped":
            how = {"timeout": "ran out of its share of the time", "exited": "exited", "raised": "raised",
                   "finished": "ended"}.get(str(info.get("ended")), str(info.get("ended")))
            err = f": {str(info.get('error') or '')[-400:]}" if info.get("error") else ""
            return f"the script (process {i}) {how} after {info.get('steps_done')} of {steps} optimizer steps{err}"
    return None


def _cause_of(run: SetupRun) -> str:
    ended = {str((info or {}).get("ended")) for info in run.infos}
    if "spawned" in ended:
        return "refused"
    return "timeout" if "timeout" in ended or run.killed else "user_code" if ended & {"raised", "exited"} else "gradprobe"


def compare_pairs(target: dict[str, Any], options: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Run setup A and the references that apply; what `options["_paired"]` carries to the engine."""
    from gradprobe.scriptmode.ranks import rank_dir

    wanted = selected(options)
    steps = max(2, int(options.get("steps") or 2))
    n = int(target.get("world_size") or 1)
    timeout = float(target.get("timeout_s") or 120.0)
    model_form = not (target.get("script") or target.get("module"))  # its accumulation is compared in one process
    todo = [c for c in PAIRED if (wanted is None or c in wanted) and not (model_form and c == "accumulation")]
    out: dict[str, Any] = {"steps": steps}
    if not todo:  # only the comparisons run on the script's first step were asked
        return out
    root = rank_dir()
    progress(Phase.RUNNING_SCRIPT)
    a = run_setup(target, "A", n, steps, os.path.join(root, "A"), timeout * A_SHARE, distributed=n > 1)
    launched = (a.infos[0] or {}).get("launched") if a.infos else None
    if launched is not None:  # a launcher that starts torchrun: the comparisons run on what it starts (launchers.py)
        from gradprobe.scriptmode.launchers import retarget

        out["launched"] = launched
        follow = retarget(target, launched) if "error" not in launched else str(launched["error"])
        if isinstance(follow, str):
            for c in todo:
                out[c] = _not_run(f"the {c} comparison", f"the script is a launcher ({launched.get('command')}) and "
                                  f"gradprobe cannot follow it: {follow}", "refused")
            return out
        target, n = follow, int(follow["world_size"])
        a = run_setup(target, "A", n, steps, os.path.join(root, "A-launched"), timeout * A_SHARE, distributed=n > 1)
    n = a.processes  # the workers a script spawns (launchers.py) are its processes
    out.update({"target": target, "world_size": n, "a": a.public(), "a_infos": a.infos})
    why = _failed_a(a, steps)
    if why is not None:
        for c in todo:
            out[c] = _not_run(f"the {c} comparison", f"the setup under test did not run its {steps} steps: {why}",
                              _cause_of(a))
        return out
    from gradprobe.scriptmode.feeds import accumulation_plan, ranks_plan

    spawned = (a.infos[0] or {}).get("spawned")
    for c in todo:
        if c == "accumulation" and spawned and n > 1:
            out[c] = _not_run("the accumulation comparison", "the script starts its workers with torch.multiprocessing."
                              "spawn: its accumulation is compared at one process (nprocs 1, through its arguments)",
                              "refused")
            continue
        plan = ranks_plan(a, target, options) if c == "ranks" else accumulation_plan(a, target, options)
        if "not_run" in plan or "why_not" in plan:
            out[c] = plan
            continue
        b = run_setup(plan["target"], "B", plan["processes"], steps, os.path.join(root, f"B-{c}"), timeout * B_SHARE,
                      distributed=plan["distributed"], feeds=plan["feeds"], accumulation_to_one=plan["to_one"])
        out[c] = {"b": b.public(), "b_infos": b.infos, **{k: v for k, v in plan.items() if k not in ("target", "feeds")}}
        out[c]["reference"] = str(plan.get("reference")) + _devices_set(b)
        bad = _failed_a(b, steps)
        if bad is not None:
            out[c]["reference_failed"] = {"why": bad, "cause": _cause_of(b)}
    progress(Phase.CHECKING)
    return out


def _devices_set(b: SetupRun) -> str:
    """The reference's device setting, where gradprobe set Lightning's or Fabric's `devices` to 1 (knobs.py)."""
    knobs = ((b.infos[0] if b.infos else None) or {}).get("knobs") or {}
    asked = [(k.split("_")[0], v) for k, v in knobs.items() if k.endswith("_devices") and v not in (1, "1", "auto")]
    return "".join(f", {'Lightning' if name == 'lightning' else 'Fabric'}'s devices set to 1 by gradprobe (the script "
                   f"asks for {v})" for name, v in asked[:1])


def run_equivalence_job(tool: str, target: dict[str, Any], options: dict[str, Any],
                        progress: Progress) -> ToolError | dict[str, Any]:
    """check_equivalence on a script in the child: the paired runs, then the engine. When a comparison that takes a
    loaded target is registered and asked, the script is run once more to its first step (as one process) and the
    engine runs there, on that step; else the engine runs here on the paired runs alone."""
    from gradprobe.checks.equivalence.engine import registered
    from gradprobe.tools import run_tool

    paired = compare_pairs(target, options, progress)
    target = paired.get("target") or target  # what a launcher starts (launchers.py)
    opts = dict(options, _paired=paired, _script=True)
    wanted = selected(options)
    others = [c for c in registered() if c not in PAIRED and (wanted is None or c in wanted)]
    if not others:
        return run_tool(tool, None, opts)
    from gradprobe.scriptmode.first_step import run_script_job
    from gradprobe.scriptmode.ranks import free_port

    if (paired.get("a_infos") or [None])[0] and (paired["a_infos"][0] or {}).get("spawned"):
        return _without_first_step(tool, opts, others, "the script starts its workers with torch.multiprocessing.spawn; "
                                   "the comparisons run on a script's first step take a torchrun-style script")
    os.environ.update(target.get("launch_env") or {})
    if int(target.get("world_size") or 1) > 1:  # the first step of a torchrun-style script, as one process
        from gradprobe.scriptmode.knobs import accumulation_hooks

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                          WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        accumulation_hooks({}, to_one=False, one_process=True).install()  # Lightning's and Fabric's devices: 1
    report = run_script_job(tool, dict(target, world_size=1), opts, progress)
    if isinstance(report, ToolError) or "comparisons" in (report.get("facts") or {}):
        return report
    # the script's first step did not load (GP112, a replay failure): the paired comparisons still stand
    why = (report.get("summary") or "the script's first step could not be loaded").splitlines()[0][:400]
    out = _without_first_step(tool, opts, others, why, "gradprobe")
    out["findings"] += [f for f in report.get("findings") or [] if f.get("code") in ("GP112", "GP113")]
    return out


def _without_first_step(tool: str, opts: dict[str, Any], others: list[str], why: str,
                        cause: str = "refused") -> dict[str, Any]:
    """The paired comparisons alone; the comparisons run on the script's first step said not run, with why."""
    from gradprobe.tools import run_tool

    out: dict[str, Any] = run_tool(tool, None, opts)
    for name in others:
        out["facts"].setdefault("not_run", []).append({"check": f"the {name} comparison", "why": why, "cause": cause})
    return out


# ---- diagnose with the comparisons ----------------------------------------------------------------------------------

NOT_ASKED = ("not asked: `compare: true` runs check_equivalence's comparisons that apply (N processes against one, k "
             "micro-batches against one batch); on a script they cost a second run of it")

RANKS_NOT_COMPARED = ("diagnose runs a build_model() target at world_size > 1 rank by rank, where no comparison runs; "
                      "check_equivalence compares its train_step's micro-batches against one batch, as one process")


def diagnose_with_comparisons(job: Any, progress: Progress, dispatch: Callable[..., Any]) -> ToolError | dict[str, Any]:
    """diagnose, with check_equivalence's comparisons when `compare` is true (a script's paired runs first, forked
    before the script runs in this process; a build_model() target's on the same loaded target, after diagnose's
    checks), merged into diagnose's report; when it is false, the report says they did not run."""
    from gradprobe.sandbox.protocol import Job
    from gradprobe.tools import BY_NAME, run_tool

    compare = bool(job.options.get("compare"))
    options = {k: v for k, v in job.options.items() if k != "compare"}
    plain = Job(tool=job.tool, target=job.target, options=options)
    script = bool(job.target.get("script") or job.target.get("module"))
    if not compare:
        # a build_model() target's train_step may accumulate (compared in process): asked of the loaded target
        has_step = None if script else (lambda loaded: {"train_step": loaded.train_step is not None})
        report = dispatch(BY_NAME["diagnose"], plain, progress, has_step)
        also = (report.get("facts") or {}).pop("_also", None) if isinstance(report, dict) else None
        if isinstance(report, dict) and (script or int(job.target.get("world_size") or 1) > 1 or (also or {}).get("train_step")):
            report.setdefault("facts", {}).setdefault("not_run", []).append(
                {"check": "the equivalence comparisons", "why": NOT_ASKED, "cause": "not_applicable"})
        return report
    # only the comparisons diagnose does not run itself: its own checks already measure custom Functions (gradcheck),
    # shared storage and packed vs padded (dependencies); run again here they would be reported twice
    eq_options = {"steps": max(2, int(options.get("steps") or 2)), "compare": list(PAIRED)}
    equivalence: Any
    if script:
        paired = compare_pairs(job.target, eq_options, progress)
        equivalence = run_tool("check_equivalence", None, dict(eq_options, _paired=paired, _script=True))
        report = dispatch(BY_NAME["diagnose"], plain, progress)
    else:
        report = dispatch(BY_NAME["diagnose"], plain, progress,
                          lambda loaded: run_tool("check_equivalence", loaded, dict(eq_options)))
        equivalence = (report.get("facts") or {}).pop("_also", None) if isinstance(report, dict) else None
    if isinstance(report, ToolError):
        return report
    if not isinstance(equivalence, dict):  # the target did not load (its report says so first), or it ran as ranks
        if script or int(job.target.get("world_size") or 1) < 2:
            return report
        entry = {"check": "the equivalence comparisons", "why": RANKS_NOT_COMPARED, "cause": "refused"}
        equivalence = {"findings": [], "summary": f"\nNot run: {entry['check']}: {entry['why']}", "facts": {"not_run": [entry]}}
    return merge_equivalence(report, equivalence)


def merge_equivalence(report: dict[str, Any], equivalence: dict[str, Any]) -> dict[str, Any]:
    """check_equivalence's findings, verified lines and not-run entries, added to a diagnose report."""
    from gradprobe.report import make_report

    facts = dict(report.get("facts") or {})
    eq_facts = equivalence.get("facts") or {}
    facts["equivalence"] = {name: entry for name, entry in (eq_facts.get("comparisons") or {}).items()
                            if entry.get("applies") is not None}  # those asked (the others are diagnose's own checks)
    facts["verified"] = list(facts.get("verified") or []) + list(eq_facts.get("verified") or [])
    facts["not_run"] = list(facts.get("not_run") or []) + list(eq_facts.get("not_run") or [])
    lines = (report.get("summary") or "").splitlines()[1:]
    lines += [line for line in (equivalence.get("summary") or "").splitlines()[1:] if line]
    return make_report(report["tool"], list(report.get("findings") or []) + list(equivalence.get("findings") or []),
                       lines, **facts)
