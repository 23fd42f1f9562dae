"""How a host starts this server: the command an MCP client's configuration names (`gradprobe mcp-config` prints it,
`gradprobe demo` starts it)."""

from __future__ import annotations

import os
import sys


def server_command() -> dict:
    """How a host starts this server: the console script next to this interpreter (it never puts the working
    directory on sys.path), else this interpreter with -P (same, Python 3.11+), else plain -m."""
    script = os.path.join(os.path.dirname(sys.executable), "gradprobe")
    if os.path.isfile(script) and os.access(script, os.X_OK) and _script_runs_this_interpreter(script):
        return {"command": script, "args": ["serve"]}
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    return {"command": sys.executable, "args": [*safe, "-m", "gradprobe", "serve"]}


def _script_runs_this_interpreter(script: str) -> bool:
    try:
        with open(script, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return False
    exe = first[2:].strip().decode(errors="replace") if first.startswith(b"#!") else ""
    return bool(exe) and os.path.realpath(exe) == os.path.realpath(sys.executable)
