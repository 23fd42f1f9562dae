"""The cost of a two-rank script-mode `diagnose` against the same script's plain two-rank run, measured in one run.

The plain run is torchrun (`python -m torch.distributed.run --standalone --nproc_per_node=2`, gloo, this machine)
of a launcher that runs the script as __main__ on each rank and exits at the rank's first optimizer step (after its
backward's all-reduce). The diagnose is the MCP call through the real server over stdio, end to end, with
`world_size: 2`: the sandboxed child forks two ranks, each runs the script under the observers to its first step and
checks that step; the reports are merged and compared across ranks. Prints one row per script and the ratio
diagnose / plain, on the default (warm) server and on `serve --cold` (a fresh interpreter per call, like torchrun's
ranks), and in the ranks: the diagnose's wait for its ranks (script to step, checks, report) against the plain
rank's script to its first step (median of REPEAT runs each).

    python benchmarks/two_ranks.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "examples" / "scripts"
CASES = [("ddp", "train.py", ["--steps=2"]), ("fsdp2", "train.py", ["--steps=2"])]

PLAIN = r"""
import os, runpy, sys, time
from torch.optim.optimizer import register_optimizer_step_pre_hook

t0 = time.monotonic()


def first_step(opt, args, kwargs):  # each rank ends at its first step, after writing how long the script took to it
    with open(os.path.join(os.environ["PLAIN_OUT"], f"rank{os.environ['RANK']}"), "w") as fh:
        fh.write(str(time.monotonic() - t0))
    os._exit(0)


register_optimizer_step_pre_hook(first_step)
path = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(path))
runpy.run_path(path, run_name="__main__")
os._exit(3)  # no step reached
"""


def plain_run(launcher: Path, project: Path, script: str, args: list[str]) -> tuple[float, float]:
    """(wall seconds of the torchrun, the slower rank's seconds from the script's start to its first step)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(launcher),
           str(project / script), *args]
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600,
                            env={**os.environ, "PLAIN_OUT": out}).returncode
        dt = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"plain two-rank run of {project.name}/{script} ended with {rc}")
        in_rank = max(float((Path(out) / f"rank{r}").read_text()) for r in range(2))
    return dt, in_rank


async def _diagnose(c: object, proj: Path, script: str, args: list[str]) -> tuple[float, float]:
    """(wall seconds of the MCP call, the slower rank's seconds in the child: its script to the step, and the checks)."""
    target = {"project_dir": str(proj), "script": script, "args": args, "timeout_s": 300, "world_size": 2}
    t0 = time.perf_counter()
    r = await c.call_tool("diagnose", {"target": target})  # type: ignore[attr-defined]
    dt = time.perf_counter() - t0
    facts = (r.structured_content or {}).get("facts") or {}
    ranks = facts.get("ranks") or {}
    assert ranks.get("world_size") == 2 and all(x["stepped"] for x in ranks["ranks"]), r.structured_content
    return dt, float(ranks["wait_seconds"])


async def main(repeat: int) -> None:
    from mcp import Client, StdioServerParameters

    kinds = {"warm": ["serve"], "cold": ["serve", "--cold"]}
    times: dict[str, dict[str, list[float]]] = {c[0]: {k: [] for k in ("plain", "plain_in", "warm", "warm_in", "cold",
                                                                        "cold_in")} for c in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        launcher = Path(tmp) / "first_step.py"
        launcher.write_text(PLAIN)
        for kind, argv in kinds.items():
            server = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", *argv])
            async with Client(server, read_timeout_seconds=600) as c:
                warmup = {"project_dir": str(SCRIPTS / "ddp"), "setup": "model = torch.nn.Linear(2, 2)"}
                await c.call_tool("inspect_parameters", {"target": warmup})
                for project, script, args in CASES:
                    proj = SCRIPTS / project
                    for _ in range(repeat):
                        if kind == "warm":
                            wall, in_rank = plain_run(launcher, proj, script, args)
                            times[project]["plain"].append(wall)
                            times[project]["plain_in"].append(in_rank)
                        wall, in_child = await _diagnose(c, proj, script, args)
                        times[project][kind].append(wall)
                        times[project][f"{kind}_in"].append(in_child)
    med = {p: {k: statistics.median(v) for k, v in t.items()} for p, t in times.items()}
    print(f"{'script':<8} {'plain torchrun s':>17} {'diagnose warm s':>16} {'ratio':>6} {'diagnose cold s':>16} "
          f"{'ratio':>6} | {'plain in-rank s':>16} {'diagnose ranks s':>17} {'ratio':>6}")
    for project, m in med.items():
        print(f"{project:<8} {m['plain']:>17.2f} {m['warm']:>16.2f} {m['warm'] / m['plain']:>6.2f} {m['cold']:>16.2f} "
              f"{m['cold'] / m['plain']:>6.2f} | {m['plain_in']:>16.2f} {m['warm_in']:>17.2f} "
              f"{m['warm_in'] / m['plain_in']:>6.2f}")
    for kind in ("warm", "cold"):
        r = statistics.median(m[kind] / m["plain"] for m in med.values())
        print(f"median ratio two-rank diagnose ({kind} server) / plain two-rank torchrun: {r:.2f}")
    r = statistics.median(m["warm_in"] / m["plain_in"] for m in med.values())
    print(f"median ratio in the ranks (diagnose: script to step + checks + merge; plain: script to step): {r:.2f} "
          f"(median of {repeat} runs each)")


if __name__ == "__main__":
    import anyio

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    anyio.run(main, ap.parse_args().repeat)
