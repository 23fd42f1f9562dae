"""Script mode's cost: a script-mode `diagnose` through the real server (MCP over stdio) against
a plain run of the same script to its first optimizer step, measured in one run.

The plain run is a fresh interpreter that runs the script as __main__ and exits at its first
optimizer step (after the step's closure, for Lightning); the diagnose is the MCP call, end to end
(sandboxed child, observers, the checks on the captured step), once on the default server (a warm
worker with torch and transformers imported forks the child) and once on `serve --cold` (a fresh
interpreter per call, like the plain run). Prints one row per script and the ratios diagnose / plain
(median of REPEAT runs each).

    python benchmarks/script_mode.py
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "examples" / "scripts"
REPEAT = 3
CASES = [("nanogpt", "train.py", ["--max_iters=3"], None),
         ("lightning", "train.py", ["--fast_dev_run=1"], "lightning"),
         ("hf_trainer", "train.py", ["--max_steps=1"], "transformers"),
         ("accelerate", "train.py", ["--epochs=1"], "accelerate")]

PLAIN = r"""
import os, runpy, sys, torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

def first_step(opt, args, kwargs):
    closure = kwargs.get("closure") or (args[1] if len(args) > 1 and callable(args[1]) else None)
    if closure is None:
        os._exit(0)
    def then_exit():
        closure()
        os._exit(0)
    if kwargs.get("closure"):
        return args, dict(kwargs, closure=then_exit)
    return (args[0], then_exit, *args[2:]), kwargs

register_optimizer_step_pre_hook(first_step)
path = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(path))
runpy.run_path(path, run_name="__main__")
os._exit(3)  # no step reached
"""


def plain_run(project: Path, script: str, args: list[str], scratch: Path) -> float:
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-c", PLAIN, str(project / script), *args], cwd=scratch,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600).returncode
    dt = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"plain run of {project.name}/{script} ended with {rc}")
    return dt


async def main() -> None:
    import tempfile

    from mcp import Client, StdioServerParameters

    warm = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve"])
    cold = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve", "--cold"])
    cases = [c for c in CASES if not c[3] or importlib.util.find_spec(c[3]) is not None]
    times: dict[str, dict[str, list[float]]] = {c[0]: {"plain": [], "warm": [], "cold": []} for c in cases}
    for kind, params in (("warm", warm), ("cold", cold)):
        async with Client(params, read_timeout_seconds=600) as c:
            warmup = {"project_dir": str(SCRIPTS / "nanogpt"), "setup": "model = torch.nn.Linear(2, 2)"}
            await c.call_tool("inspect_parameters", {"target": warmup})
            for project, script, args, _ in cases:
                proj = SCRIPTS / project
                for _ in range(REPEAT):
                    if kind == "warm":
                        with tempfile.TemporaryDirectory() as scratch:
                            for entry in proj.iterdir():
                                (Path(scratch) / entry.name).symlink_to(entry)
                            times[project]["plain"].append(plain_run(proj, script, args, Path(scratch)))
                    t0 = time.perf_counter()
                    target = {"project_dir": str(proj), "script": script, "args": args, "timeout_s": 300}
                    r = await c.call_tool("diagnose", {"target": target})
                    times[project][kind].append(time.perf_counter() - t0)
                    sc = r.structured_content or {}
                    assert "script_step" in (sc.get("facts") or {}), sc.get("summary")
    print(f"{'script':<12} {'plain to 1st step s':>20} {'diagnose warm s':>16} {'ratio':>6} {'diagnose cold s':>16} {'ratio':>6}")
    ratios: dict[str, list[float]] = {"warm": [], "cold": []}
    for project, t in times.items():
        p, w, c_ = (statistics.median(t[k]) for k in ("plain", "warm", "cold"))
        ratios["warm"].append(w / p)
        ratios["cold"].append(c_ / p)
        print(f"{project:<12} {p:>20.2f} {w:>16.2f} {w / p:>6.2f} {c_:>16.2f} {c_ / p:>6.2f}")
    if times:
        print(f"median ratio diagnose/plain: warm server {statistics.median(ratios['warm']):.2f}, "
              f"cold server {statistics.median(ratios['cold']):.2f} (median of {REPEAT} runs each)")


if __name__ == "__main__":
    import anyio

    anyio.run(main)
