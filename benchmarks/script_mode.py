"""Script mode's cost: a script-mode `diagnose` through the real server (MCP over stdio) against
a plain run of the same script to its first optimizer step, measured in one run.

The plain run is a fresh interpreter that runs the script as __main__ and exits at its first
optimizer step (after the step's closure, for Lightning); the diagnose is the MCP call, end to end
(sandboxed child, observers, the checks on the captured step). Prints one row per script and the
ratio diagnose / plain (median of REPEAT runs each).

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

    params = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve"])
    rows = []
    async with Client(params, read_timeout_seconds=600) as c:
        await c.call_tool("inspect_parameters", {"target": {"project_dir": str(SCRIPTS / "nanogpt"), "setup": "model = torch.nn.Linear(2, 2)"}})
        for project, script, args, needs in CASES:
            if needs and importlib.util.find_spec(needs) is None:
                print(f"{project}: skipped (needs {needs})")
                continue
            proj = SCRIPTS / project
            plain, diag = [], []
            for _ in range(REPEAT):
                with tempfile.TemporaryDirectory() as scratch:
                    for entry in proj.iterdir():
                        (Path(scratch) / entry.name).symlink_to(entry)
                    plain.append(plain_run(proj, script, args, Path(scratch)))
                t0 = time.perf_counter()
                r = await c.call_tool("diagnose", {"target": {"project_dir": str(proj), "script": script, "args": args, "timeout_s": 300}})
                diag.append(time.perf_counter() - t0)
                sc = r.structured_content or {}
                assert "script_step" in (sc.get("facts") or {}), sc.get("summary")
            p, d = statistics.median(plain), statistics.median(diag)
            rows.append((project, p, d, d / p))
    print(f"{'script':<12} {'plain to 1st step s':>20} {'script-mode diagnose s':>24} {'ratio':>7}")
    for project, p, d, ratio in rows:
        print(f"{project:<12} {p:>20.2f} {d:>24.2f} {ratio:>7.2f}")
    if rows:
        print(f"median ratio diagnose/plain: {statistics.median(r[3] for r in rows):.2f} (median of {REPEAT} runs each)")


if __name__ == "__main__":
    import anyio

    anyio.run(main)
