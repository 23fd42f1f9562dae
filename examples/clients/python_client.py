"""Call gradprobe's diagnose through the official MCP Python SDK, over stdio, and print the root cause.

    python examples/clients/python_client.py path/to/train.py
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp import Client, StdioServerParameters


async def main(path: str) -> int:
    path = os.path.abspath(path)
    server = StdioServerParameters(command=sys.executable, args=["-m", "gradprobe", "serve"])
    async with Client(server, read_timeout_seconds=300) as client:
        async def progress(done, total, message):
            print(f"  ... {message}", file=sys.stderr)

        result = await client.call_tool(
            "diagnose", {"target": {"project_dir": os.path.dirname(path), "model": os.path.basename(path)}},
            progress_callback=progress,
        )
    if result.is_error:
        print(result.content[0].text)
        return 2
    report = result.structured_content
    print(report["summary"].splitlines()[0])
    for f in report["findings"]:
        loc = f.get("location") or {}
        where = f" ({os.path.basename(loc['file'])}:{loc['line']})" if loc else ""
        print(f"- {f['severity']} {f['code']}{where}: {f['message']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1]))
