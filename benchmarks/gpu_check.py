"""GPU check: every example of examples/broken with device="cuda" through the real server, plus the
trace-overhead benchmark on a GPT-2-small-sized model on the GPU; prints a table.

Skips cleanly (exit 0, one line) on a machine without CUDA.

    python benchmarks/gpu_check.py
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "broken"


def expect_of(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECT":
            return ast.literal_eval(node.value)
    return {}


async def run_examples() -> list[tuple]:
    from mcp import Client, StdioServerParameters

    rows = []
    params = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve"])
    async with Client(params, read_timeout_seconds=600) as c:
        for path in sorted(EXAMPLES.glob("*.py")):
            exp = expect_of(path)
            t0 = time.perf_counter()
            r = await c.call_tool(exp["tool"], {"target": {"project_dir": str(EXAMPLES), "model": path.name, "device": "cuda"},
                                                **exp.get("options", {})})
            dt = time.perf_counter() - t0
            sc = r.structured_content or {}
            codes = [f["code"] for f in sc.get("findings", [])]
            if exp.get("healthy") or not exp.get("codes"):
                ok = not any(f["severity"] == "error" for f in sc.get("findings", []))
            else:
                ok = bool(set(codes) & set(exp["codes"]))
            dev = (sc.get("facts") or {}).get("cuda", {}).get("device_name", "?")
            rows.append((path.stem, exp["tool"], "PASS" if ok else "MISS", ",".join(codes[:3]), f"{dt:.2f}", dev))
    return rows


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: skipped, no CUDA device is visible on this machine")
        return 0
    import anyio

    rows = anyio.run(run_examples)
    print(f"{'example':40s} {'tool':26s} {'result':6s} {'codes':24s} {'s':>6s} device")
    for r in rows:
        print(f"{r[0]:40s} {r[1]:26s} {r[2]:6s} {r[3]:24s} {r[4]:>6s} {r[5]}")
    print(f"examples passing on CUDA: {sum(r[2] == 'PASS' for r in rows)}/{len(rows)}")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_overhead.py"), "--device", "cuda"],
                         capture_output=True, text=True)
    print(out.stdout.strip() or out.stderr[-2000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
