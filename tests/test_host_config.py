"""Host configs that work from a virtualenv: full paths, and `mcp-config` printing one that really starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mcp import Client, StdioServerParameters

from conftest import ROOT
from gradprobe.tools import NAMES

CLIENTS = ROOT / "examples" / "clients"


def test_every_bundled_stdio_config_names_the_server_by_full_path():
    configs = sorted(CLIENTS.glob("*.json"))
    assert configs
    for path in configs:
        data = json.loads(path.read_text())
        servers = data.get("mcpServers") or data.get("servers")
        for name, server in servers.items():
            if server.get("type") == "http":
                continue
            assert os.path.isabs(server["command"]), f"{path.name}: {name} starts {server['command']!r}, not a full path"


@pytest.mark.anyio
async def test_mcp_config_starts_a_server_without_the_users_path():
    out = subprocess.run([sys.executable, "-m", "gradprobe", "mcp-config"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    server = json.loads(out.stdout)["mcpServers"]["gradprobe"]
    # the console script next to this interpreter (it never puts the host's working directory on sys.path)
    assert os.path.isabs(server["command"]) and os.path.dirname(server["command"]) == os.path.dirname(sys.executable)
    assert server["args"][-1] == "serve" and (server["command"] == sys.executable) == ("-m" in server["args"])
    # what a desktop host gives a server: a bare PATH, no virtualenv, another working directory
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]  # a development checkout; an installed gradprobe needs none
    params = StdioServerParameters(command=server["command"], args=server["args"], env=env, cwd="/")
    async with Client(params, read_timeout_seconds=120) as c:
        assert len((await c.list_tools()).tools) == len(NAMES)
