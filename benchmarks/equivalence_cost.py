"""What one check_equivalence comparison costs against running its two setups plainly, measured in the same run.

For each case: the setup under test run plainly (the script as the user runs it: its N ranks as torchrun would start
them, in parallel), then the reference run plainly (one process; or the script with the reference's arguments), each
to the same number of optimizer steps; then `gradprobe check_equivalence` on the same script (the CLI: the sandboxed
child, both paired runs, the comparison). The ratio printed is the comparison's wall time over the two plain runs'
(issue 37 asks for <= 2.5x). Wall times are of this machine at this moment; only the ratio is compared.

    python -m benchmarks.equivalence_cost [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "examples" / "scripts"
STEPS = 2  # optimizer steps: the comparison's default, and what the plain runs are given

# (name, project, script, world size, the script's args for STEPS steps, the reference's extra args, compare)
CASES = [
    ("N processes against one (DDP, 2 ranks)", "equiv_ranks", "mean_loss_batchnorm.py", 2, [f"--steps={STEPS}"], [],
     "ranks"),
    ("k micro-batches against one batch (plain loop)", "equiv_accum", "loop_divided.py", 1, [f"--steps={STEPS}"],
     ["--grad-accum", "1"], "accumulation"),
    # nanoGPT scales its accumulation with the world size: the reference measures its micro-batches on one step more
    ("N processes against one, batches made without a DataLoader (nanoGPT-style, 2 ranks, accumulation)", "equiv_ranks",
     "nanogpt_ddp_accum.py", 2, [f"--max_iters={STEPS + 1}"], [], "ranks"),
    ("N processes against one (Lightning Trainer, strategy=ddp, 2 ranks)", "equiv_ranks",
     "lightning_contrastive_labels_offset.py", 2, [f"--max_steps={STEPS}"], ["--devices=1"], "ranks"),
    ("N processes against one (Lightning Fabric, 2 ranks)", "equiv_ranks", "fabric_gather_sync_grads.py", 2,
     [f"--steps={STEPS}"], ["--devices=1"], "ranks"),
    ("N processes against one (mp.spawn, 2 workers)", "equiv_launch", "spawn_ddp.py", 1, [f"--steps={STEPS}"],
     ["--world_size=1"], "ranks"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plain(project: Path, script: str, world: int, args: list[str], tries: int = 3) -> float:
    """The script run as a user runs it: `world` processes with torchrun's environment when > 1 (or WORLD_SIZE=1 for a
    distributed script's one-process run), all at once; the wall time until the last ends. A run where a process died
    by a signal (plain torch's gloo sometimes aborts at exit here: "terminate called without an active exception") is
    said and run again, up to `tries` times."""
    for _ in range(tries - 1):
        try:
            return _plain_once(project, script, world, args)
        except SystemExit as exc:
            if "-6" not in str(exc):
                raise
            print(f"({exc}: run again)", flush=True)
    return _plain_once(project, script, world, args)


def _plain_once(project: Path, script: str, world: int, args: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1" if world > 1 else env.get("OMP_NUM_THREADS", "")}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, script, *args], cwd=project, stdout=subprocess.DEVNULL,
                              env={**env, **{k: v for k, v in base.items() if v}, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"{script} exited with {codes} when run plainly")
    return time.perf_counter() - t0


def compared(project: Path, script: str, world: int, args: list[str], ref: list[str],
             compare: str) -> tuple[float, float]:
    """The tool's wall time (the CLI, the sandboxed child, both runs, the comparison), and its two runs' own."""
    # typed as the user types it, from the script's folder (the plain runs' working directory: relative data paths)
    cmd = [sys.executable, "-m", "gradprobe", "check_equivalence", "--script", script, "--json",
           "--compare", compare, "--steps", str(STEPS), "--timeout", "600"]
    if world > 1:
        cmd += ["--world-size", str(world)]
    if ref:
        cmd.append("--reference-args=" + " ".join(ref))
    t0 = time.perf_counter()
    out = subprocess.run([*cmd, "--", *args], cwd=project, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - t0
    import json

    try:
        facts = json.loads(out.stdout)["facts"]["comparisons"][compare]["facts"]
    except (ValueError, KeyError):
        raise SystemExit(f"check_equivalence did not compare {script}: {out.stdout[-2000:]}{out.stderr[-2000:]}") from None
    return seconds, float(facts["seconds"]["test"] or 0) + float(facts["seconds"]["reference"] or 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    opts = parser.parse_args()
    for name, project, script, world, args, ref, compare in CASES:
        folder = SCRIPTS / project
        for _ in range(opts.repeat):
            a = plain(folder, script, world, args)
            b = plain(folder, script, 1, [*args, *ref]) if (world > 1 or ref) else a
            c, runs = compared(folder, script, world, args, ref, compare)
            print(f"{name}: setup A plainly {a:.1f} s, the reference plainly {b:.1f} s, check_equivalence {c:.1f} s "
                  f"(its two watched runs {runs:.1f} s, forked from the warm child: no interpreter start): "
                  f"{c / (a + b):.2f}x the two plain runs")


if __name__ == "__main__":
    main()
