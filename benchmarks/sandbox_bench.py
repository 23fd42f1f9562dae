"""Sandbox and server figures, each a ratio or a number measured in this run.

(a) a warm tool call (the warm worker's spare: forked and half-confined before the call) vs a cold
    `python` script doing the same check (import torch + the user's code + inspect_parameters), with
    every isolation layer on (the line lists the layers the server verified); targets <= 50 ms, >= 40x
(b) server start -> tools/list answered, over stdio with the official client; target <= 0.5 s
(c) inspect_parameters with device="meta" on a Llama-7B-sized config: wall time and the child's
    peak RSS; targets <= 5 s and <= 1.5 GiB
(d) calls per second with N concurrent calls on a small model

    python benchmarks/sandbox_bench.py [--parts abcd] [--calls 6] [--concurrency 1 2 4] [--against TREE]

--against TREE (with part a): the same paced warm calls against a server started from another checkout (e.g. the
tree before a change: `git worktree add /tmp/before HEAD~3`), alternating with this one's over --rounds rounds, so
both medians come from the same run and the same load; the line gives their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "broken"
SMALL = {"project_dir": str(EXAMPLES), "model": "gp101_temperature_tensor.py"}
LLAMA_7B = textwrap.dedent("""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    model = LlamaForCausalLM(cfg)
""")
COLD_SCRIPT = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(EXAMPLES)!r})
    import torch
    from gradprobe.checks import inspect_parameters
    import gp101_temperature_tensor as case
    report = inspect_parameters(case.build_model())
    assert report["findings"][0]["code"] == "GP101"
""")


def params(tree: Path = ROOT) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["PYTHONPATH"] = str(tree)
    return StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve"], env=env, cwd=str(tree))


async def against(args) -> None:
    """Paced warm calls to two servers at once, this tree's and another's, alternating call by call: both medians
    under the same load (the machine is shared: a load that drifts between two separate runs would decide)."""
    trees = {"this tree": ROOT, args.against: Path(args.against)}
    times: dict[str, list[float]] = {name: [] for name in trees}
    loads = []
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for name, tree in trees.items():
            clients[name] = await stack.enter_async_context(Client(params(tree), read_timeout_seconds=600))
        targets = {name: {"project_dir": str(tree / "examples" / "broken"), "model": "gp101_temperature_tensor.py"}
                   for name, tree in trees.items()}
        for name, c in clients.items():
            for _ in range(3):  # the worker is warm and its spares made
                await c.call_tool("inspect_parameters", {"target": targets[name]})
        for i in range(args.calls * args.rounds):
            loads.append(os.getloadavg()[0])
            for name in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                got, _ = await warm_calls(clients[name], 1, pause_s=0.05, target=targets[name])
                times[name] += got
    (mine, theirs) = (statistics.median(v) for v in times.values())
    print(f"(a') paced warm calls to both servers, alternating, {len(times['this tree'])} each: this tree median "
          f"{mine * 1000:.0f} ms, {args.against} median {theirs * 1000:.0f} ms: {mine / theirs:.2f}x; "
          f"load (1 min) {min(loads):.1f}-{max(loads):.1f}")


async def start_to_tools_list() -> float:
    t0 = time.perf_counter()
    async with Client(params()) as c:
        await c.list_tools()
    return time.perf_counter() - t0


async def main(args) -> None:
    if "b" in args.parts:
        starts = [await start_to_tools_list() for _ in range(3)]
        print(f"(b) server start -> tools/list: median {statistics.median(starts):.2f} s over 3 starts (target <= 0.5 s)")

    cold = []
    for _ in range(3 if "a" in args.parts else 0):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", COLD_SCRIPT], check=True, capture_output=True)
        cold.append(time.perf_counter() - t0)
    async with Client(params(), read_timeout_seconds=600) as c:
        await c.call_tool("inspect_parameters", {"target": SMALL})  # the worker is warm after this
        if "a" in args.parts:
            paced, r = await warm_calls(c, args.calls, pause_s=0.05)  # a person's or an agent's pace: the spare is ready
            burst, _ = await warm_calls(c, args.calls, pause_s=0.0)  # back to back: the next spare is made meanwhile
            sandbox = r.structured_content["facts"]["sandbox"]
            verified = sandbox["isolation"].get("verified_by_server", {})
            missing = [k for k, v in verified.items() if str(v).startswith("MISSING")]
            layers = ", ".join(sorted(sandbox["isolation"].get("applied", {})))
            ratio = statistics.median(cold) / statistics.median(paced)
            print(f"(a) cold script: median {statistics.median(cold):.3f} s; warm tool call ({sandbox['child']}): median "
                  f"{statistics.median(paced) * 1000:.0f} ms (min {min(paced) * 1000:.0f} ms; "
                  f"back to back: median {statistics.median(burst) * 1000:.0f} ms); "
                  f"ratio {ratio:.1f}x (targets <= 50 ms, >= 40x); layers: {layers}; verified by the server: "
                  f"{'all' if verified and not missing else 'MISSING ' + ', '.join(missing) if verified else 'none'}")

        if "c" in args.parts:
            t0 = time.perf_counter()
            target = {"project_dir": str(ROOT), "setup": LLAMA_7B, "device": "meta", "timeout_s": 300}
            r = await c.call_tool("inspect_parameters", {"target": target})
            wall = time.perf_counter() - t0
            sc = r.structured_content
            print(f"(c) Llama-7B config on meta: {sc['facts']['counts']['numel']:,} values in {wall:.2f} s, child peak RSS "
                  f"{sc['facts']['child_peak_rss_mb'] / 1024:.2f} GiB (targets <= 5 s, <= 1.5 GiB)")

        for n in args.concurrency if "d" in args.parts else []:
            async def one():
                await c.call_tool("inspect_parameters", {"target": SMALL})

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(n * 2):
                    tg.start_soon(one)
            dt = time.perf_counter() - t0
            print(f"(d) {n * 2} calls launched together from one client (server pool: cores): {n * 2 / dt:.1f} calls/s")
    if args.against and "a" in args.parts:
        await against(args)
    if os.path.exists("/proc/loadavg"):
        print(f"load average (1, 5, 15 min) at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")


async def warm_calls(c: Client, n: int, pause_s: float, target: dict | None = None):
    times, r = [], None
    for _ in range(n):
        if pause_s:
            await anyio.sleep(pause_s)
        t0 = time.perf_counter()
        r = await c.call_tool("inspect_parameters", {"target": target or SMALL})
        times.append(time.perf_counter() - t0)
        assert r.structured_content["findings"][0]["code"] == "GP101"
    return times, r


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="abcd", help="which figures to measure, e.g. --parts a")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--against", default=None, metavar="TREE", help="another checkout to compare paced warm calls with")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds with --against")
    anyio.run(main, ap.parse_args())
