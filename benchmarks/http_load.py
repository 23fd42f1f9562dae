"""Load and soak test of the Streamable HTTP server, on loopback only, bounded in count and time.

load: N concurrent clients (each its own user and token) x M calls, mixing fast targets
(inspect_parameters on a small model) and slow ones (a build_model that sleeps); prints
calls completed, failures (target 0), p50/p95 latency, and the fast calls' latency while
slow ones run, against fast calls on an idle server (fairness).
soak: S sequential calls; prints leaked sandbox processes, the server's open file
descriptors and its RSS before and after (targets: none, none, flat).

    python benchmarks/http_load.py [--clients 8] [--calls 4] [--soak 500] [--deadline 600]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid: int) -> tuple[int, float]:
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS")) / 1024
    return fds, rss


def sandbox_procs() -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if b"gradprobe/sandbox/child.py" in cmd:
                n += 1
    return n


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def main(args) -> None:
    keys = Path(tempfile.mkdtemp(prefix="gradprobe-load-"))  # the token file, outside every root (the server insists)
    work = keys / "root"
    work.mkdir(mode=0o755)  # with roots a call reads its project as others would
    (work / "fast.py").write_text("import torch, torch.nn as nn\ndef build_model():\n    return nn.Linear(4, 2)\n")
    (work / "slow.py").write_text("import time, torch.nn as nn\n"
                                  "def build_model():\n    time.sleep(2.0)\n    return nn.Linear(4, 2)\n")
    users = [f"user{i}" for i in range(args.clients)]
    (keys / "tokens").write_text("".join(f"{u}:{u}-token-{i:04d}\n" for i, u in enumerate(users)))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gradprobe", "serve", "--http", "--port", str(port), "--token-file",
                               str(keys / "tokens"), "--allow-root", str(work)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx2.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                time.sleep(0.2)
        with anyio.fail_after(args.deadline):
            await run_load(args, url, work, users)
            if args.soak:
                await run_soak(args, url, work, users[0], server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)


async def one_client(url: str, token: str, fn):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as c:
            return await fn(c)


async def timed_call(c, work: Path, name: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    try:
        r = await c.call_tool("inspect_parameters", {"target": {"project_dir": str(work), "model": f"{name}.py"}})
        ok = not r.is_error and r.structured_content["ok"]
    except Exception:
        ok = False
    return time.perf_counter() - t0, ok


async def run_load(args, url, work, users) -> None:
    idle: list[float] = []

    async def idle_fast(c):
        await timed_call(c, work, "fast")  # warm-up
        for _ in range(3):
            idle.append((await timed_call(c, work, "fast"))[0])

    await one_client(url, f"{users[0]}-token-0000", idle_fast)
    results: dict[str, list] = {"fast": [], "slow": []}

    async def client(i: int):
        async def calls(c):
            for k in range(args.calls):
                kind = "slow" if (i + k) % 2 == 0 else "fast"
                results[kind].append(await timed_call(c, work, kind))
        await one_client(url, f"{users[i]}-token-{i:04d}", calls)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(args.clients):
            tg.start_soon(client, i)
    wall = time.perf_counter() - t0
    allc = results["fast"] + results["slow"]
    lat = [t for t, _ in allc]
    fails = sum(1 for _, ok in allc if not ok)
    fast = [t for t, _ in results["fast"]]
    print(f"load: {args.clients} clients x {args.calls} calls = {len(allc)} calls in {wall:.1f} s, failures {fails}")
    print(f"latency p50 {statistics.median(lat):.2f} s, p95 {pct(lat, 0.95):.2f} s (slow targets sleep 2 s in build_model)")
    print(f"fast calls: idle server p50 {statistics.median(idle):.2f} s; "
          f"under load p50 {statistics.median(fast):.2f} s, p95 {pct(fast, 0.95):.2f} s")


async def run_soak(args, url, work, user, pid) -> None:
    async def soak(c):
        await timed_call(c, work, "fast")
        fds0, rss0 = proc_stats(pid)
        fails = 0
        for _ in range(args.soak):
            _, ok = await timed_call(c, work, "fast")
            fails += not ok
        await anyio.sleep(1.0)
        fds1, rss1 = proc_stats(pid)
        print(f"soak: {args.soak} sequential calls, failures {fails}; leaked sandbox processes {sandbox_procs()}; "
              f"server fds {fds0} -> {fds1}; server RSS {rss0:.0f} -> {rss1:.0f} MiB")

    await one_client(url, f"{user}-token-0000", soak)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--soak", type=int, default=500)
    ap.add_argument("--deadline", type=float, default=900)
    anyio.run(main, ap.parse_args())
