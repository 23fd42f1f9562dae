"""`gradprobe demo`: diagnose a bundled broken model through the real server and the official client."""

from __future__ import annotations

import os
import sys

DEMO_DIR = os.path.dirname(os.path.abspath(__file__))


def run_demo() -> int:
    import anyio
    from mcp import Client, StdioServerParameters

    from gradprobe.render import render_text
    from gradprobe.serve_command import server_command

    async def go() -> dict:
        from mcp.client.stdio import get_default_environment

        env = get_default_environment()
        if os.environ.get("PYTHONPATH"):  # a development checkout: the server runs the same gradprobe as this demo
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        params = StdioServerParameters(**server_command(), env=env)
        async with Client(params, read_timeout_seconds=300) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            print(f"server tools: {', '.join(tools)}")
            target = {"project_dir": DEMO_DIR, "model": "broken_model.py", "device": "cpu"}
            print(f"calling diagnose on {os.path.join(DEMO_DIR, 'broken_model.py')} ...\n")
            result = await client.call_tool("diagnose", {"target": target})
            return result.structured_content or {}

    report = anyio.run(go)
    print(render_text(report, color=sys.stdout.isatty()))
    mermaid = (report.get("facts") or {}).get("mermaid")
    if mermaid:
        print("\nGradient flow (Mermaid):\n" + mermaid)
    return 0 if report.get("findings") else 1
